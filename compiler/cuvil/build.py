"""The three stages behind `cuvil build`, each also a subcommand, with a content-hashed
local cache: capture (framework) -> .cvir; compile (numpy + llvmlite) -> object, weights
object, header, manifest; link (C toolchain) -> executable, .so or .a.

Cache entries live in `<cache>/<stage>/<key>/` and are written to a temporary directory
that is renamed into place when complete, so an interrupted build leaves the cache valid.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from .config import Config, ConfigError
from .errors import CuvilError

CACHE_FORMAT = "1"
_PKG = Path(__file__).resolve().parent


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _hash(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _tree_hash(root: Path, patterns: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for p in sorted(q for pat in patterns for q in root.rglob(pat)):
        if "__pycache__" in p.parts:
            continue
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def compiler_hash() -> str:
    """Everything the compile stage's output depends on in Cuvil itself."""
    return _tree_hash(_PKG, ("*.py",))


def runtime_hash() -> str:
    return _tree_hash(_PKG / "runtime", ("*.c", "*.h"))


def atomic_write(path: Path, data: bytes | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_copy(src: Path, dst: Path) -> None:
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        shutil.copymode(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class Cache:
    """Completed stage outputs by key; `get_or_make` builds missing entries atomically."""

    def __init__(self, root: Path, log: Callable[[str], None] = print):
        self.root = Path(root)
        self.log = log

    def entry(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def get_or_make(self, stage: str, key: str, make: Callable[[Path], None],
                    valid: Callable[[Path], bool] = lambda p: True) -> tuple[Path, bool]:
        final = self.entry(stage, key)
        if final.is_dir() and valid(final):
            self.log(f"[{stage}] cached ({key[:12]})")
            return final, True
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{key}."))
        start = time.monotonic()
        try:
            make(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        self.log(f"[{stage}] done in {time.monotonic() - start:.1f}s ({key[:12]})")
        return final, False


# -- capture ----------------------------------------------------------------------------------
def _import_entry(cfg: Config):
    m = cfg.data["model"]
    for p in reversed([cfg.resolve(p) for p in m.get("python_path", [])]):
        if str(p.resolve()) not in sys.path:
            sys.path.insert(0, str(p.resolve()))
    try:
        if "source" in m:
            src = cfg.resolve(m["source"]).resolve()
            name = "cuvil_user_model_" + hashlib.sha256(str(src).encode()).hexdigest()[:8]
            spec = importlib.util.spec_from_file_location(name, src)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(m["module"])
    except CuvilError:
        raise
    except Exception as e:
        key = "source" if "source" in m else "module"
        raise cfg.error(["model", key], f"importing the model failed: {type(e).__name__}: {e}") from e
    entry = getattr(mod, m["entry"], None)
    if not callable(entry):
        raise cfg.error(["model", "entry"], f"{m['entry']!r} is not a function in {mod.__name__}")
    return entry


def _example_inputs(cfg: Config, given):
    """The entry's example inputs, checked against (or made from) the config's inputs."""
    import numpy as np
    import torch

    from .ir.types import DTYPES
    specs = cfg.data.get("inputs")
    if given is None:
        if not specs:
            raise cfg.error(["model", "entry"], "the entry returned no example inputs and the config has no 'inputs'")
        rng = np.random.default_rng(0)
        return tuple(torch.from_numpy(rng.standard_normal(s["shape"]).astype(DTYPES[s.get("dtype", "f32")]))
                     for s in specs)
    given = tuple(given)
    if specs:
        if len(specs) != len(given):
            raise cfg.error(["inputs"], f"the model takes {len(given)} inputs, the config lists {len(specs)}")
        from .frontends.torch import cuvil_dtype
        for i, (s, x) in enumerate(zip(specs, given)):
            if list(x.shape) != list(s["shape"]):
                raise cfg.error(["inputs", i, "shape"], f"the model's example input has shape {list(x.shape)}")
            if "dtype" in s and cuvil_dtype(x.dtype) != s["dtype"]:
                raise cfg.error(["inputs", i, "dtype"], f"the model's example input is {cuvil_dtype(x.dtype)}")
    return given


def capture_to(cfg: Config, out: Path) -> list[Path]:
    """Run the config's entry point, capture the model, write `out` (.cvir). Returns the
    project files the capture read (for the cache's dependency check)."""
    before = set(sys.modules)
    entry = _import_entry(cfg)
    try:
        result = entry()
    except Exception as e:
        raise cfg.error(["model", "entry"], f"calling the entry failed: {type(e).__name__}: {e}") from e
    model, given = (result if isinstance(result, tuple) and len(result) == 2 else (result, None))
    inputs = _example_inputs(cfg, given)
    from .frontends.torch import capture_torch
    from .ir import write_bundle
    names = [s["name"] for s in cfg.data.get("inputs", [])] or None
    module = capture_torch(model, inputs, name_inputs=names)
    write_bundle(module, out)
    return _project_files(before, cfg)


def _project_files(before: set, cfg: Config) -> list[Path]:
    roots = [cfg.base.resolve()] + [cfg.resolve(p).resolve() for p in cfg.data["model"].get("python_path", [])]
    skip = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), _PKG]
    files = set()
    if "source" in cfg.data["model"]:
        files.add(cfg.resolve(cfg.data["model"]["source"]).resolve())
    for name in set(sys.modules) - before:
        f = getattr(sys.modules.get(name), "__file__", None)
        if not isinstance(f, str) or not os.path.isabs(f) or not os.path.isfile(f):
            continue
        p = Path(f).resolve()
        if any(p.is_relative_to(s) for s in skip):
            continue
        if any(p.is_relative_to(r) for r in roots):
            files.add(p)
    return sorted(files)


def capture_key(cfg: Config) -> str:
    return _hash("capture", CACHE_FORMAT, cfg.section_hash("model", "inputs"), compiler_hash(),
                 str(cfg.base.resolve()))


def _deps_valid(entry: Path) -> bool:
    try:
        deps = json.loads((entry / "deps.json").read_text())
        return all(Path(p).is_file() and sha256_file(Path(p)) == h for p, h in deps.items())
    except (OSError, ValueError):
        return False


def cached_capture(cfg: Config, cache: Cache) -> Path:
    def make(tmp: Path):
        files = capture_to(cfg, tmp / "model.cvir")
        atomic_write(tmp / "deps.json", json.dumps({str(p): sha256_file(p) for p in files}, indent=1,
                                                   sort_keys=True))
    entry, _ = cache.get_or_make("capture", capture_key(cfg), make, _deps_valid)
    return entry / "model.cvir"


# -- compile ------------------------------------------------------------------------------------
def compile_options(cfg: Config) -> dict:
    """Everything from the config that the compile stage's output depends on (plain data)."""
    d = cfg.data
    pre = {s["name"]: dict(s["preprocess"]) for s in d.get("inputs", []) if s.get("preprocess")}
    post = {}
    for i, o in enumerate(d.get("outputs", [])):
        p = dict(o.get("postprocess") or {})
        if p.get("labels"):
            text = cfg.resolve(p["labels"]).read_text(encoding="utf-8")
            p["labels"] = [line.strip() for line in text.splitlines() if line.strip()]
        if p and p.get("kind") != "none":
            post[o["name"]] = p
    target = dict(d.get("target") or {})
    return {
        "name": cfg.name,
        "output_names": [o["name"] for o in d.get("outputs", [])],
        "preprocess": pre,
        "postprocess": post,
        "target": {"arch": target.get("arch", "host"), "cpu": target.get("cpu", ""),
                   "features": target.get("features", "")},
        "quantization": (d.get("quantization") or {}).get("method", "none"),
        "threads": (d.get("optimize") or {}).get("threads", 1),
        "fuse": (d.get("optimize") or {}).get("fuse", True),
    }


# Config/CLI target names -> LLVM triples.
TRIPLES = {
    "x86_64-linux-gnu": "x86_64-unknown-linux-gnu",
    "aarch64-linux-gnu": "aarch64-unknown-linux-gnu",
    "wasm32-wasi": "wasm32-unknown-wasi",
}


def resolve_target(opts: dict):
    """The LLVM target for the options: 'host' is this machine (its CPU features);
    a named arch uses that arch's baseline unless cpu/features are given."""
    from .backend.llvm.target import Target, host_target
    t = opts["target"]
    arch = t["arch"]
    if arch == "host":
        host = host_target()
        if not host.triple.startswith("x86_64"):
            raise CuvilError(f"the host {host.triple} is not a supported target")
        if t["cpu"] or t["features"]:
            return Target.from_triple("x86_64-unknown-linux-gnu", t["cpu"], t["features"])
        return Target("x86_64-unknown-linux-gnu", host.cpu, host.features)
    if arch not in TRIPLES:
        raise CuvilError(f"target {arch!r} is not supported (supported: host, {', '.join(TRIPLES)})")
    return Target.from_triple(TRIPLES[arch], t["cpu"], t["features"])


def compile_bundle(cvir: Path, opts: dict, out_dir: Path) -> dict:
    """The compile stage: .cvir + options -> <name>.o, <name>.weights.o, <name>.h,
    <name>.json in out_dir. Imports no framework. Returns the manifest."""
    from .backend.header import render_header
    from .backend.llvm.codegen import generate
    from .backend.llvm.kernels import scratch_bytes
    from .backend.llvm.target import compile_to_object
    from .backend.llvm.weights import weights_object
    from .ir import read_bundle
    from .passes.pipeline import default_pipeline, run_pipeline

    q = opts["quantization"]
    if q not in ("none", "fp16", "int8_sym", "int4_block"):
        raise CuvilError(f"unknown quantization method {q!r} (known: none, fp16, int8_sym, int4_block)")
    if q != "none":
        raise CuvilError(f"quantization method {q!r} is not implemented yet (implemented: none)")
    module = read_bundle(cvir)
    fn = module.main
    names = opts.get("output_names") or []
    if names:
        if len(names) != len(fn.output_names):
            raise CuvilError(f"the model has {len(fn.output_names)} outputs, the config names {len(names)}")
        fn.output_names = list(names)
    for name in list(opts["preprocess"]) + list(opts["postprocess"]):
        if name not in fn.input_names + fn.output_names:
            raise CuvilError(f"pre/post-processing names {name!r}, which is not an input or output of the model")
    passes = default_pipeline(memory_plan={"scratch": scratch_bytes},
                              **({} if opts.get("fuse", True) else {"fuse_epilogues": False}))
    run_pipeline(module, passes)
    target = resolve_target(opts)
    name = opts["name"]
    gen = generate(module, name, target.vector_bits)
    manifest = {
        "format": "cuvil-manifest-1",
        "prefix": name,
        "target": {"triple": target.triple, "cpu": target.cpu, "features": target.features},
        "arena_size": gen.arena_size,
        "threads": opts["threads"],
        "inputs": [{"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in gen.inputs],
        "outputs": [{"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in gen.outputs],
        "preprocess": opts["preprocess"],
        "postprocess": opts["postprocess"],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / f"{name}.o", compile_to_object(gen.llvm_ir, target))
    atomic_write(out_dir / f"{name}.weights.o", weights_object(f"{name}_weights", gen.weights, target))
    atomic_write(out_dir / f"{name}.h", render_header(manifest))
    atomic_write(out_dir / f"{name}.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def cached_compile(cvir: Path, opts: dict, cache: Cache) -> Path:
    key = _hash("compile", CACHE_FORMAT, sha256_file(cvir), opts, compiler_hash())
    entry, _ = cache.get_or_make("compile", key, lambda tmp: compile_bundle(cvir, opts, tmp))
    return entry


# -- link -----------------------------------------------------------------------------------------
KIND_FILES = {"executable": "{name}", "shared": "lib{name}.so", "static": "lib{name}.a"}
_NATIVE_KIND = {"executable": "exe", "shared": "shared", "static": "static"}


def link_compiled(compiled: Path, kind: str, out: Path, cc: str = "cc") -> Path:
    """The link stage: the compile stage's outputs in `compiled` -> one artifact at `out`."""
    from .native import link_artifact
    manifests = sorted(compiled.glob("*.json"))
    if len(manifests) != 1:
        raise CuvilError(f"{compiled}: expected one manifest (*.json) from the compile stage, found {len(manifests)}")
    manifest = json.loads(manifests[0].read_text())
    name = manifest["prefix"]
    objects = [compiled / f"{name}.o", compiled / f"{name}.weights.o"]
    for p in objects + [compiled / f"{name}.h"]:
        if not p.is_file():
            raise CuvilError(f"{p}: missing compile-stage output")
    return link_artifact(_NATIVE_KIND[kind], objects, manifest, compiled / f"{name}.h", out, cc=cc)


def _cc_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        raise CuvilError(f"the C compiler {cc!r} was not found (install gcc or set CC)") from None


def cached_link(compiled: Path, kind: str, cache: Cache, cc: str = "cc") -> Path:
    files = {p.name: sha256_file(p) for p in sorted(compiled.iterdir()) if p.is_file()}
    key = _hash("link", CACHE_FORMAT, files, kind, runtime_hash(), compiler_hash(), _cc_version(cc))
    name = json.loads(next(compiled.glob("*.json")).read_text())["prefix"]
    fname = KIND_FILES[kind].format(name=name)

    def make(tmp: Path):
        link_compiled(compiled, kind, tmp / fname, cc)
        if kind != "executable":
            shutil.copyfile(compiled / f"{name}.h", tmp / f"{name}.h")
    entry, _ = cache.get_or_make("link", key, make)
    return entry / fname


def build(cfg: Config, output: Path, *, kind: str | None = None, cache_dir: Path | None = None,
          cc: str | None = None, log: Callable[[str], None] = print) -> Path:
    """capture -> compile -> link with the cache; copy the artifact to `output` atomically."""
    kind = kind or (cfg.data.get("build") or {}).get("artifact", "executable")
    cc = cc or os.environ.get("CC", "cc")
    cache = Cache(cache_dir or cfg.base / ".cuvil-cache", log)
    opts = compile_options(cfg)
    resolve_target(opts)  # fail before any work on an impossible target
    cvir = cached_capture(cfg, cache)
    compiled = cached_compile(cvir, opts, cache)
    artifact = cached_link(compiled, kind, cache, cc)
    output = Path(output)
    atomic_copy(artifact, output)
    if kind != "executable":
        atomic_copy(artifact.parent / f"{opts['name']}.h", output.parent / f"{opts['name']}.h")
    log(f"[build] {output}")
    return output
