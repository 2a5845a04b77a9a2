"""The link stage: a model's objects + the C runtime -> executable, shared or static library.

`link_artifact` needs only the compile stage's manifest (a dict, see DESIGN.md §1 and
`cuvil.backend.header`), the objects (model.o, weights.o) and the model's header. It
compiles the runtime's C sources with `cc` and a generated glue file that defines the
header's prefixed API (and, for an executable, the pre/post-processing tables main
reads), then links:

    exe     runtime + main + model; libjpeg, libpng and zlib linked statically when an
            input has image pre-processing; otherwise only -lm -lpthread
    shared  lib<prefix>.so exporting the prefixed API and the runtime's public calls
    static  an archive of the runtime, the API glue and the model objects

Outputs appear atomically (temporary file, then rename) and do not depend on where
the build ran: compiler paths are mapped with -ffile-prefix-map, archives are
written with `ar D` (no timestamps or owners).
"""
from __future__ import annotations

import contextlib
import math
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .backend.header import c_string, check_manifest, render_header
from .errors import CuvilError, LinkError
from .runtime import CORE_SOURCES, EXE_SOURCES, RUNTIME_DIR

KINDS = ("exe", "shared", "static")
CODEC_ARCHIVES = ("libjpeg.a", "libpng16.a", "libz.a")  # in link order
CODEC_PACKAGES = "libjpeg62-turbo-dev libpng-dev zlib1g-dev"
MAX_IMAGE_SIDE = 16384  # CUVIL_IMAGE_MAX_SIDE
_LAYOUTS = {"NCHW": "CUVIL_LAYOUT_NCHW", "NHWC": "CUVIL_LAYOUT_NHWC"}
_COLORS = {"RGB": ("CUVIL_COLOR_RGB", 3), "BGR": ("CUVIL_COLOR_BGR", 3), "GRAY": ("CUVIL_COLOR_GRAY", 1)}


def _bad(key: str, msg: str) -> CuvilError:
    return CuvilError(f"manifest: {key}: {msg}")


def _positive_int(value, key: str, limit: int = MAX_IMAGE_SIDE) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise _bad(key, f"must be an integer from 1 to {limit}, got {value!r}")
    return value


def _pair(value, key: str) -> tuple[int, int]:
    """An int n -> (n, n); [h, w] -> (h, w)."""
    if isinstance(value, list) and len(value) == 2:
        return _positive_int(value[0], key), _positive_int(value[1], key)
    n = _positive_int(value, key)
    return n, n


def _floats(value, n: int, key: str) -> list[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or len(value) not in (1, n) or \
            not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        raise _bad(key, f"must be 1 or {n} finite numbers, got {value!r}")
    return [float(v) for v in value] * (n // len(value))


def _c_float(v: float) -> str:
    return f"{float(v)!r}f"


def image_config(name: str, cfg: dict, tensor: dict) -> dict:
    """The checked pre-processing of image input `name` (defaults filled in).

    Keys: resize (int: shorter side; [h, w]: exact; absent: none), crop (int or
    [h, w]; must equal the input's H x W; absent: H x W), scale (default 1/255),
    mean (default 0), std (default 1), layout (NCHW | NHWC), color (RGB | BGR | GRAY).
    """
    key = f"preprocess.{name}"
    known = {"kind", "resize", "crop", "scale", "mean", "std", "layout", "color"}
    if set(cfg) - known:
        raise _bad(key, f"unknown key {sorted(set(cfg) - known)[0]!r} (known: {', '.join(sorted(known))})")
    shape = tensor["shape"]
    if tensor["dtype"] != "f32":
        raise _bad(key, f"image inputs must be f32, input {name!r} is {tensor['dtype']}")
    if len(shape) not in (3, 4) or (len(shape) == 4 and shape[0] != 1):
        raise _bad(key, f"image inputs need shape [1, C, H, W] or [C, H, W] (or NHWC), got {shape}")
    layout = cfg.get("layout", "NCHW")
    if layout not in _LAYOUTS:
        raise _bad(f"{key}.layout", f"must be NCHW or NHWC, got {layout!r}")
    c, h, w = shape[-3:] if layout == "NCHW" else (shape[-1], *shape[-3:-1])
    color = cfg.get("color", "RGB")
    if color not in _COLORS or _COLORS[color][1] != c:
        raise _bad(f"{key}.color", f"{color!r} does not fit {c} channel(s) (RGB and BGR need 3, GRAY 1)")
    if h < 1 or w < 1 or h > MAX_IMAGE_SIDE or w > MAX_IMAGE_SIDE:
        raise _bad(key, f"input {name!r} has an image size of {h}x{w}")
    resize = cfg.get("resize")
    resize_short, resize_hw = 0, (0, 0)
    if isinstance(resize, list):
        resize_hw = _pair(resize, f"{key}.resize")
    elif resize is not None:
        resize_short = _positive_int(resize, f"{key}.resize")
    if cfg.get("crop") is not None and _pair(cfg["crop"], f"{key}.crop") != (h, w):
        raise _bad(f"{key}.crop", f"{cfg['crop']!r} does not match input {name!r} of {h}x{w} (H x W)")
    scale = cfg.get("scale", 1.0 / 255.0)
    std = _floats(cfg.get("std", 1.0), c, f"{key}.std")
    if 0.0 in std:
        raise _bad(f"{key}.std", "must not contain 0")
    return {"resize_short": resize_short, "resize_hw": resize_hw, "scale": _floats(scale, 1, f"{key}.scale")[0],
            "mean": _floats(cfg.get("mean", 0.0), c, f"{key}.mean"), "std": std, "layout": layout, "color": color}


def classification_config(name: str, cfg: dict, tensor: dict) -> dict:
    """The checked classification post-processing of output `name`: top_k, softmax, labels."""
    key = f"postprocess.{name}"
    known = {"kind", "top_k", "softmax", "labels"}
    if set(cfg) - known:
        raise _bad(key, f"unknown key {sorted(set(cfg) - known)[0]!r} (known: {', '.join(sorted(known))})")
    if tensor["dtype"] not in ("f32", "f16", "f64"):
        raise _bad(key, f"classification needs a float output, {name!r} is {tensor['dtype']}")
    classes = math.prod(tensor["shape"])
    if not tensor["shape"] or classes != tensor["shape"][-1] or classes < 1:
        raise _bad(key, f"classification needs one row of scores ([K] or [1, K]), {name!r} is {tensor['shape']}")
    top_k = _positive_int(cfg.get("top_k", 5), f"{key}.top_k", 2**31 - 1)
    softmax = cfg.get("softmax", False)
    if not isinstance(softmax, bool):
        raise _bad(f"{key}.softmax", f"must be true or false, got {softmax!r}")
    labels = cfg.get("labels") or []
    if not isinstance(labels, list) or not all(isinstance(s, str) and "\0" not in s for s in labels):
        raise _bad(f"{key}.labels", "must be a list of strings")
    if labels and len(labels) != classes:
        raise _bad(f"{key}.labels", f"has {len(labels)} labels for {classes} classes")
    return {"top_k": min(top_k, classes), "softmax": softmax, "labels": labels}


def _processing(manifest: dict) -> tuple[list[dict | None], list[dict | None]]:
    """Per input the image config (or None), per output the classification config (or None)."""
    def by_name(section: str, tensors: list[dict], kind: str, check) -> list[dict | None]:
        cfgs = manifest.get(section) or {}
        if not isinstance(cfgs, dict):
            raise _bad(section, "must be an object keyed by tensor name")
        names = [t["name"] for t in tensors]
        for n, cfg in cfgs.items():
            if n not in names:
                raise _bad(f"{section}.{n}", f"no such tensor (known: {', '.join(names)})")
            if not isinstance(cfg, dict) or cfg.get("kind") != kind:
                got = cfg.get("kind") if isinstance(cfg, dict) else cfg
                raise _bad(f"{section}.{n}.kind", f"must be {kind!r}, got {got!r}")
        return [check(t["name"], cfgs[t["name"]], t) if t["name"] in cfgs else None for t in tensors]
    return (by_name("preprocess", manifest["inputs"], "image", image_config),
            by_name("postprocess", manifest["outputs"], "classification", classification_config))


def render_glue(manifest: dict, header_name: str, app: bool) -> str:
    """The C file that defines the header's API (and, with `app`, `cuvil_main_app`)."""
    p = manifest["prefix"]
    lines = [f"/* Generated by Cuvil for the model '{p}': its API" + (" and the executable's tables." if app else "."),
             " * Do not edit. */",
             f"#define {p.upper()}_IMPLEMENTATION",
             f'#include "{header_name}"']
    if not app:
        return "\n".join(lines) + "\n"
    pre, post = _processing(manifest)
    lines += ['#include "cuvil_app.h"', ""]
    entries = []
    for i, cfg in enumerate(pre):
        if cfg is None:
            entries.append("    {CUVIL_PRE_NONE, 0, 0, 0, 0.0f, NULL, NULL, CUVIL_LAYOUT_NCHW, CUVIL_COLOR_RGB},")
            continue
        for which in ("mean", "std"):
            vals = ", ".join(_c_float(v) for v in cfg[which])
            lines.append(f"static const float pre{i}_{which}[{len(cfg[which])}] = {{{vals}}};")
        rh, rw = cfg["resize_hw"]
        entries.append(f"    {{CUVIL_PRE_IMAGE, {cfg['resize_short']}, {rh}, {rw}, {_c_float(cfg['scale'])}, "
                       f"pre{i}_mean, pre{i}_std, {_LAYOUTS[cfg['layout']]}, {_COLORS[cfg['color']][0]}}},")
    lines += [f"static const cuvil_image_pre pre[{max(len(pre), 1)}] = {{",
              *(entries or ["    {CUVIL_PRE_NONE, 0, 0, 0, 0.0f, NULL, NULL, CUVIL_LAYOUT_NCHW, CUVIL_COLOR_RGB},"]),
              "};"]
    entries = []
    for j, cfg in enumerate(post):
        if cfg is None:
            entries.append("    {CUVIL_POST_NONE, 0, 0, 0, NULL},")
            continue
        labels = "NULL"
        if cfg["labels"]:
            lines.append(f"static const char *const post{j}_labels[{len(cfg['labels'])}] = {{")
            lines += [f"    {c_string(s)}," for s in cfg["labels"]]
            lines.append("};")
            labels = f"post{j}_labels"
        entries.append(f"    {{CUVIL_POST_CLASSIFICATION, {cfg['top_k']}, {int(cfg['softmax'])}, "
                       f"{len(cfg['labels'])}, {labels}}},")
    lines += [f"static const cuvil_post post[{len(post)}] = {{", *entries, "};", "",
              f"const cuvil_app cuvil_main_app = {{&{p}_model, pre, post}};"]
    return "\n".join(lines) + "\n"


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    except OSError as exc:
        raise LinkError(f"{what}: cannot run {cmd[0]!r}: {exc}") from exc
    if proc.returncode != 0:
        raise LinkError(f"{what} failed (exit {proc.returncode}):\n  {shlex.join(cmd)}\n{proc.stderr.strip()}")
    return proc.stdout


def _static_archives(cc: list[str]) -> list[str]:
    found = []
    for name in CODEC_ARCHIVES:
        path = _run([*cc, f"-print-file-name={name}"], f"looking for {name}").strip()
        if not os.path.isabs(path) or not os.path.isfile(path):
            raise LinkError(f"{name} not found by {shlex.join(cc)}: image inputs link libjpeg, libpng and zlib "
                            f"statically; install {CODEC_PACKAGES} (make setup)")
        found.append(path)
    return found


def link_artifact(kind: str, objects: Sequence[str | os.PathLike], manifest: dict,
                  header_path: str | os.PathLike | None, out: str | os.PathLike, *,
                  cc: str = "cc", workdir: str | os.PathLike | None = None) -> Path:
    """Link `objects` (model.o, weights.o) with the runtime into `out` (see module docstring).

    `header_path` is the model's `<prefix>.h` (None: render it from the manifest into
    the work directory). `cc` may carry arguments ("ccache gcc", "clang --target=...").
    `workdir` keeps the intermediate files (default: a temporary directory).
    Raises LinkError (with the command and its stderr) when the toolchain fails, and
    CuvilError naming the manifest key when the manifest is wrong.
    """
    if kind not in KINDS:
        raise LinkError(f"unknown artifact kind {kind!r}: expected one of {', '.join(KINDS)}")
    check_manifest(manifest)
    pre, _ = _processing(manifest)
    out = Path(out)
    if not out.parent.is_dir():
        raise LinkError(f"cannot link {out}: directory {out.parent} does not exist")
    objects = [Path(o) for o in objects]
    for o in objects:
        if not o.is_file():
            raise LinkError(f"cannot link {out}: object {o} does not exist")
    ccmd = shlex.split(cc)
    if not ccmd:
        raise LinkError("no C compiler given (cc is empty)")
    prefix = manifest["prefix"]
    with contextlib.ExitStack() as stack:
        if workdir is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cuvil-link-")))
        else:
            work = Path(workdir)
            work.mkdir(parents=True, exist_ok=True)
        work = work.resolve()
        if header_path is None:
            header = work / f"{prefix}.h"
            header.write_text(render_header(manifest))
        else:
            header = Path(header_path).resolve()
            if not header.is_file():
                raise LinkError(f"cannot link {out}: header {header_path} does not exist")
        glue = work / f"{prefix}_glue.c"
        glue.write_text(render_glue(manifest, header.name, app=kind == "exe"))
        images = kind == "exe" and any(cfg is not None for cfg in pre)
        flags = ["-std=c99", "-O2", "-fPIC", "-pthread",
                 f"-ffile-prefix-map={RUNTIME_DIR}=cuvil/runtime", f"-ffile-prefix-map={work}=.",
                 f"-ffile-prefix-map={header.parent}=.", "-I", str(header.parent), "-I", str(RUNTIME_DIR)]
        if kind == "shared":
            flags.append("-fvisibility=hidden")
        if kind == "exe" and not images:
            flags.append("-DCUVIL_NO_CODECS")
        sources = [RUNTIME_DIR / s for s in CORE_SOURCES + (EXE_SOURCES if kind == "exe" else ())] + [glue]
        compiled = []
        for src in sources:
            obj = work / (src.stem + ".o")
            _run([*ccmd, *flags, "-c", str(src), "-o", obj.name], f"compiling {src.name} for {out}", cwd=work)
            compiled.append(obj.name)
        model_objs = []
        for i, o in enumerate(objects):  # fixed member names: the archive must not depend on the caller's paths
            name = f"{prefix}_{i}_{o.name}"
            shutil.copyfile(o, work / name)
            model_objs.append(name)

        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            if kind == "static":
                tmp.unlink()  # ar appends to an existing file
                ar = _run([*ccmd, "-print-prog-name=ar"], "looking for ar").strip() or "ar"
                _run([ar, "rcsD", str(tmp), *compiled, *model_objs], f"archiving {out}", cwd=work)
                os.chmod(tmp, 0o644)
            else:
                cmd = [*ccmd, "-o", str(tmp), *compiled, *model_objs]
                if kind == "shared":
                    cmd[1:1] = ["-shared", f"-Wl,-soname,{out.name}", "-Wl,-z,defs"]
                elif images:
                    cmd += _static_archives(ccmd)
                _run(cmd + ["-lm", "-lpthread"], f"linking {out}", cwd=work)
                os.chmod(tmp, 0o755)
            os.replace(tmp, out)
        finally:
            if tmp.exists():
                tmp.unlink()
    return out


def write_header(manifest: dict, path: str | os.PathLike) -> Path:
    """Write `<prefix>.h` for `manifest` to `path` atomically."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(render_header(manifest))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


__all__ = ["KINDS", "link_artifact", "render_glue", "write_header", "image_config", "classification_config"]
