"""The C glue of a compiled model: the file that defines its header's API and, for an
executable, the pre/post-processing tables `main` reads (`render_glue`), with the checks
of the manifest's pre/post-processing sections it is made from (`image_config`,
`classification_config`, `plugin_use`). Errors name the manifest key.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence

from .backend.header import c_string
from .errors import CuvilError

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
    if len(shape) not in (3, 4) or (len(shape) == 4 and shape[0] != 1 and not isinstance(shape[0], str)) or \
            any(isinstance(d, str) for d in shape[-3:]):
        raise _bad(key, f"image inputs need shape [1, C, H, W] or [C, H, W] (or NHWC; a symbolic batch is "
                        f"filled with one image), got {shape}")
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
    fixed = [1 if isinstance(d, str) else d for d in tensor["shape"][:-1]]  # a symbolic batch: one row per run
    classes = math.prod(fixed) * (tensor["shape"][-1] if tensor["shape"] and isinstance(tensor["shape"][-1], int) else 0)
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


def plugin_use(key: str, cfg) -> dict:
    """A checked plugin use: {"plugin": C name, "options": {str: str}}."""
    if not isinstance(cfg, dict) or not isinstance(cfg.get("plugin"), str) or \
            not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", cfg["plugin"]):
        raise _bad(f"{key}.plugin", f"must name a plugin (a C identifier), got {cfg!r}")
    options = cfg.get("options") or {}
    if not isinstance(options, dict) or not all(isinstance(k, str) and isinstance(v, str) and "\0" not in k + v
                                                for k, v in options.items()):
        raise _bad(f"{key}.options", "must map strings to strings")
    return {"kind": "plugin", "plugin": cfg["plugin"], "options": dict(sorted(options.items()))}


def processing(manifest: dict) -> tuple[list[dict | None], list[dict | None]]:
    """Per input the image config or plugin use (or None), per output the classification
    config (or None)."""
    def by_name(section: str, tensors: list[dict], checks: dict) -> list[dict | None]:
        cfgs = manifest.get(section) or {}
        if not isinstance(cfgs, dict):
            raise _bad(section, "must be an object keyed by tensor name")
        names = [t["name"] for t in tensors]
        for n, cfg in cfgs.items():
            if n not in names:
                raise _bad(f"{section}.{n}", f"no such tensor (known: {', '.join(names)})")
            if not isinstance(cfg, dict) or cfg.get("kind") not in checks:
                got = cfg.get("kind") if isinstance(cfg, dict) else cfg
                raise _bad(f"{section}.{n}.kind", f"must be {' or '.join(map(repr, checks))}, got {got!r}")
        out = []
        for t in tensors:
            cfg = cfgs.get(t["name"])
            out.append(None if cfg is None else checks[cfg["kind"]](t["name"], cfg, t))
        return out
    return (by_name("preprocess", manifest["inputs"],
                    {"image": image_config, "plugin": lambda n, c, t: plugin_use(f"preprocess.{n}", c)}),
            by_name("postprocess", manifest["outputs"], {"classification": classification_config}))


def _post_plugin(manifest: dict) -> dict | None:
    use = (manifest.get("plugins") or {}).get("postprocess")
    return None if use is None else plugin_use("plugins.postprocess", use)


def used_plugins(manifest: dict) -> list[str]:
    """Names of the plugins the manifest's pre/post-processing calls."""
    pre, _ = processing(manifest)
    post = _post_plugin(manifest)
    return sorted({u["plugin"] for u in pre + [post] if u is not None and u.get("kind") == "plugin"})


def _options_c(lines: list[str], name: str, options: dict) -> str:
    """Static arrays of an options dict; returns the cuvil_plugin_options initializer."""
    if not options:
        return "{0, NULL, NULL}"
    for which, items in (("keys", options.keys()), ("values", options.values())):
        lines.append(f"static const char *const {name}_{which}[{len(options)}] = {{"
                     + ", ".join(c_string(v) for v in items) + "};")
    return f"{{{len(options)}, {name}_keys, {name}_values}}"


def render_glue(manifest: dict, header_name: str, app: bool, plugins: Sequence[str] | None = None) -> str:
    """The C file that defines the header's API (and, with `app`, `cuvil_main_app`).

    `plugins`: the names of every plugin module linked in (default: those the
    manifest's pre/post-processing uses); the executable checks each at start."""
    p = manifest["prefix"]
    lines = [f"/* Generated by Cuvil for the model '{p}': its API" + (" and the executable's tables." if app else "."),
             " * Do not edit. */",
             f"#define {p.upper()}_IMPLEMENTATION",
             f'#include "{header_name}"']
    if not app:
        return "\n".join(lines) + "\n"
    pre, post = processing(manifest)
    post_plugin = _post_plugin(manifest)
    names = sorted(set(used_plugins(manifest)) | set(plugins or ()))
    lines += ['#include "cuvil_app.h"', ""]
    lines += [f"extern const cuvil_plugin cuvil_plugin_{n};" for n in names]
    entries = []
    for i, cfg in enumerate(pre):
        if cfg is None:
            entries.append("    {CUVIL_PRE_NONE, 0, 0, 0, 0.0f, NULL, NULL, CUVIL_LAYOUT_NCHW, CUVIL_COLOR_RGB},")
            continue
        if cfg.get("kind") == "plugin":
            opts = _options_c(lines, f"pre{i}", cfg["options"])
            entries.append("    {CUVIL_PRE_PLUGIN, 0, 0, 0, 0.0f, NULL, NULL, CUVIL_LAYOUT_NCHW, CUVIL_COLOR_RGB, "
                           f"{{&cuvil_plugin_{cfg['plugin']}, {opts}}}}},")
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
    lines += [f"static const cuvil_post post[{len(post)}] = {{", *entries, "};"]
    post_use = "{NULL, {0, NULL, NULL}}"
    if post_plugin is not None:
        post_use = f"{{&cuvil_plugin_{post_plugin['plugin']}, {_options_c(lines, 'post', post_plugin['options'])}}}"
    table = "NULL"
    if names:
        lines.append(f"static const cuvil_plugin *const plugins[{len(names)}] = {{"
                     + ", ".join(f"&cuvil_plugin_{n}" for n in names) + "};")
        table = "plugins"
    threads = manifest.get("threads", 1)  # optimize.threads: the executable's default --threads
    threads = threads if isinstance(threads, int) and 1 <= threads <= 256 else 1
    lines += ["", f"const cuvil_app cuvil_main_app = {{&{p}_model, pre, post, {post_use}, {len(names)}, {table}, "
              f"{threads}}};"]
    return "\n".join(lines) + "\n"
