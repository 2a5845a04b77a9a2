"""The capture stage: a config's model (PyTorch entry point, TensorFlow model or
SavedModel, ONNX file) -> a framework-free .cvir bundle, cached by the config's model,
inputs and dims sections and the project files the capture read.

`plugin.custom_ops` entries map a framework op to `cuvil.custom {symbol}` while the
model is captured.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from .cache import CACHE_FORMAT, Cache, cache_key, compiler_hash, sha256_file
from .config import Config
from .errors import CuvilError
from .fsutil import atomic_write

_PKG = Path(__file__).resolve().parent


def _forget_foreign_module(name: str, roots: list[Path]) -> None:
    """A module of this name imported earlier from outside the config's python_path
    (another project's `model.py`, say) must not stand in for the config's own."""
    top = name.split(".")[0]
    mod = sys.modules.get(top)
    f = getattr(mod, "__file__", None)
    if mod is None or not f or not roots:
        return
    if not any(Path(f).resolve().is_relative_to(r) for r in roots):
        for key in [k for k in sys.modules if k == top or k.startswith(top + ".")]:
            del sys.modules[key]


# What the user's model code may raise: any exception, and also sys.exit() and a
# KeyboardInterrupt raised by the code itself; each becomes one line naming the file.
_USER_ERRORS = (Exception, SystemExit, KeyboardInterrupt)


def _describe(e: BaseException) -> str:
    """`Type: message` (one line, cut short) and where in the user's code it was raised."""
    import traceback
    text = " ".join(str(e).split())
    text = f"{type(e).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}" if text else type(e).__name__
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
    if frames and not frames[-1].filename.startswith(str(Path(__file__).parent)):
        text += f" (at {frames[-1].filename}:{frames[-1].lineno})"
    return text


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
            if spec is None or spec.loader is None:
                raise cfg.error(["model", "source"], f"{src}: not a Python source file (.py)")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        else:
            _forget_foreign_module(m["module"], [cfg.resolve(p).resolve() for p in m.get("python_path", [])])
            mod = importlib.import_module(m["module"])
    except CuvilError:
        raise
    except _USER_ERRORS as e:
        key = "source" if "source" in m else "module"
        raise cfg.error(["model", key], f"importing the model failed: {_describe(e)}") from None
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
        return tuple(torch.from_numpy(rng.standard_normal(_example_shape(cfg, s)).astype(DTYPES[s.get("dtype", "f32")]))
                     for s in specs)
    given = tuple(given)
    if specs:
        if len(specs) != len(given):
            raise cfg.error(["inputs"], f"the model takes {len(given)} inputs, the config lists {len(specs)}")
        from .frontends.torch import cuvil_dtype
        for i, (s, x) in enumerate(zip(specs, given)):
            if len(x.shape) != len(s["shape"]) or any(
                    isinstance(d, int) and d != n for d, n in zip(s["shape"], x.shape)):
                raise cfg.error(["inputs", i, "shape"], f"the model's example input has shape {list(x.shape)}")
            if "dtype" in s and cuvil_dtype(x.dtype) != s["dtype"]:
                raise cfg.error(["inputs", i, "dtype"], f"the model's example input is {cuvil_dtype(x.dtype)}")
    return given


def _example_shape(cfg: Config, spec: dict) -> list[int]:
    """A config input's shape for a generated example: a symbolic dim is 2, or its nearest
    bound (torch.export specialises a dim whose example is 1)."""
    dims = cfg.data.get("dims") or {}
    return [d if isinstance(d, int) else min(max(2, dims[d][0]), dims[d][1]) for d in spec["shape"]]


def _dynamic(cfg: Config):
    """(dynamic_shapes, dim_bounds) for capture_torch, or (None, None) for static shapes."""
    dims = cfg.data.get("dims") or {}
    if not dims:
        return None, None
    return [list(s["shape"]) for s in cfg.data.get("inputs", [])], {k: tuple(v) for k, v in dims.items()}


def _custom_op_handler(symbol: str):
    """A frontend handler lowering a framework op to `cuvil.custom {symbol}`: tensor
    arguments become operands, numbers become params, the result type is torch's."""
    from .ir import Value

    def lower(low, args: dict):
        tensors, params = [], []
        for v in args.values():
            for x in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(x, Value):
                    tensors.append(x)
                elif isinstance(x, (int, float)) and not isinstance(x, bool):
                    params.append(float(x))
        t = low.meta_type()
        return low.op("cuvil.custom", *tensors, symbol=symbol, shape=list(t.shape), dtype=t.dtype, params=params)
    return lower


def capture_to(cfg: Config, out: Path) -> list[Path]:
    """Run the config's entry point, capture the model, write `out` (.cvir). Returns the
    project files the capture read (for the cache's dependency check).

    `plugin.custom_ops` entries map a framework op (`namespace::name`, e.g. a
    torch.library custom op) to `cuvil.custom {symbol}` for this capture."""
    before = set(sys.modules)
    if cfg.data["model"]["framework"] != "pytorch":
        module, files = _capture_tf_or_onnx(cfg)
        from .ir import write_bundle
        write_bundle(module, out)
        return sorted(set(_project_files(before, cfg)) | set(files))
    entry = _import_entry(cfg)
    try:
        result = entry()
    except CuvilError:
        raise
    except _USER_ERRORS as e:
        raise cfg.error(["model", "entry"], f"calling the entry failed: {_describe(e)}") from None
    model, given = (result if isinstance(result, tuple) and len(result) == 2 else (result, None))
    checkpoint = _load_checkpoint(cfg, model)
    inputs = _example_inputs(cfg, given)
    from .frontends.torch import capture_torch, handlers
    from .ir import write_bundle
    names = [s["name"] for s in cfg.data.get("inputs", [])] or None
    custom = {c["op"]: _custom_op_handler(c["symbol"]) for c in (cfg.data.get("plugin") or {}).get("custom_ops", [])}
    table = handlers()  # every handler module registered first: the custom ops then win over them
    saved = {k: table[k] for k in custom if k in table}
    table.update(custom)
    try:
        dynamic_shapes, dim_bounds = _dynamic(cfg)
        module = capture_torch(model, inputs, name_inputs=names, dynamic_shapes=dynamic_shapes,
                               dim_bounds=dim_bounds)
    finally:
        for k in custom:
            table.pop(k, None)
        table.update(saved)
    write_bundle(module, out)
    return sorted(set(_project_files(before, cfg)) | set(checkpoint))


def _load_checkpoint(cfg: Config, model) -> list[Path]:
    """Load `model.checkpoint` (a state dict: torch.save's .pt/.pth, or .safetensors) into
    the entry's model, strictly: every key present, none extra, each shape equal. Returns
    the file (a dependency of the capture's cache entry), or [] without a checkpoint."""
    rel = cfg.data["model"].get("checkpoint")
    if rel is None:
        return []
    import torch
    path, keys = cfg.resolve(rel).resolve(), ["model", "checkpoint"]
    if not isinstance(model, torch.nn.Module):
        raise cfg.error(keys, f"the entry returned a {type(model).__name__}, not a torch.nn.Module to load it into")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        text = " ".join(str(e).split())
        raise cfg.error(keys, f"{path}: cannot read the state dict: {type(e).__name__}: {text[:300]}") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise cfg.error(keys, f"{path}: not a state dict (a mapping of parameter names to tensors)")
    own = model.state_dict()
    problems = []
    for what, names in (("missing", [k for k in own if k not in state]),
                        ("unexpected", [k for k in state if k not in own])):
        if names:
            problems.append(f"{len(names)} {what} key{'s' * (len(names) > 1)} ({', '.join(names[:3])}"
                            f"{', ...' if len(names) > 3 else ''})")
    shapes = [f"{k} is {list(state[k].shape)} in the file, {list(own[k].shape)} in the model"
              for k in own if k in state and state[k].shape != own[k].shape]
    if shapes:
        problems.append(f"{len(shapes)} shape mismatch{'es' * (len(shapes) > 1)} ({'; '.join(shapes[:3])}"
                        f"{'; ...' if len(shapes) > 3 else ''})")
    if problems:
        raise cfg.error(keys, f"{path} does not match the entry's model: {', '.join(problems)}")
    with torch.no_grad():
        model.load_state_dict(state, strict=True)
    return [path]


def _capture_tf_or_onnx(cfg: Config):
    """(IR module, model files read) for framework tensorflow (a SavedModel directory or an
    entry returning a Keras model / tf.function and optionally its example inputs) or onnx
    (a .onnx file). Example inputs are NumPy arrays in the framework's own layout."""
    import numpy as np

    from .ir.types import DTYPES, dtype_of
    m, specs = cfg.data["model"], cfg.data.get("inputs") or []
    names = [s["name"] for s in specs] or None
    given, files = None, []
    if "entry" in m:
        try:
            result = _import_entry(cfg)()
        except CuvilError:
            raise
        except _USER_ERRORS as e:
            raise cfg.error(["model", "entry"], f"calling the entry failed: {_describe(e)}") from None
        model, given = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
    else:
        model = cfg.resolve(m.get("saved_model") or m["onnx"])
        files = [model] if model.is_file() else sorted(p for p in model.rglob("*") if p.is_file())
    if given is None:
        rng = np.random.default_rng(0)
        given = [rng.standard_normal(_example_shape(cfg, s)).astype(DTYPES[s.get("dtype", "f32")]) for s in specs]
    given = [np.asarray(x) for x in given]
    if specs and len(specs) != len(given):
        raise cfg.error(["inputs"], f"the model takes {len(given)} inputs, the config lists {len(specs)}")
    for i, (s, x) in enumerate(zip(specs, given)):
        if len(x.shape) != len(s["shape"]) or any(isinstance(d, int) and d != n for d, n in zip(s["shape"], x.shape)):
            raise cfg.error(["inputs", i, "shape"], f"the model's example input has shape {list(x.shape)}")
        if "dtype" in s and dtype_of(x) != s["dtype"]:
            raise cfg.error(["inputs", i, "dtype"], f"the model's example input is {dtype_of(x)}")
    if m["framework"] == "onnx":
        from .frontends.onnx import capture_onnx
        _, dim_bounds = _dynamic(cfg)
        module = capture_onnx(model, given, name_inputs=names, dim_bounds=dim_bounds)
        for i, (s, a) in enumerate(zip(specs, module.main.args)):
            if list(a.type.shape) != list(s["shape"]):
                raise cfg.error(["inputs", i, "shape"], f"the model's input is {list(a.type.shape)} (symbolic dims "
                                "are the model's dim_params with bounds under 'dims')")
        return module, files
    from .frontends.tf import capture_tf
    return capture_tf(model if "entry" in m else str(model), given, name_inputs=names), files


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
    custom = (cfg.data.get("plugin") or {}).get("custom_ops", [])
    return cache_key("capture", CACHE_FORMAT, cfg.section_hash("model", "inputs", "dims"), custom, compiler_hash(),
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
