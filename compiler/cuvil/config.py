"""`config.yaml`: one build's declarative description, validated before any work.

The YAML is read by `yaml_load.compose_config` (a regular file of at most 1 MiB; no Python
or other non-standard tags, no duplicate keys, bounded depth and alias expansion; node
marks kept for line numbers), checked
against a JSON schema (jsonschema), then checked for the files it names. Every error
names the key and the file:line where it was written.

Conditional sections: `overrides` is a list of entries `{when: {target: T or [T, ...]},
<section>: ...}` applied, in order, when the build's target is one of the T's (`host`
and `x86_64-linux-gnu` name the same target). Mappings merge key by key; `inputs` and
`outputs` entries merge into the entry of the same `name`; other lists replace; `key:
null` removes a key (e.g. an input's `preprocess` on a target without image codecs).
The result is validated like the base config, and an error in it names the override.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .backend.llvm.target import HOST_TARGET, TARGET_NAMES
from .errors import CuvilError, short
from .options import PRECISIONS, QUANTIZATION_METHODS, RANGES
from .yaml_load import ConfigError, compose_config

DTYPES = ["f32", "f16", "f64", "i64", "i32", "i8", "u8", "bool"]
TARGETS = list(TARGET_NAMES)
ARTIFACTS = ["executable", "shared", "static"]

_C_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_OPTIONS = {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}
_PREPROCESS = {
    "type": "object", "additionalProperties": False, "required": ["kind"],
    "properties": {
        "kind": {"enum": ["image", "plugin"]},
        "plugin": {"type": "string", "pattern": _C_NAME},
        "options": _OPTIONS,
        "resize": {"type": "integer", "minimum": 1},
        "crop": {"oneOf": [{"type": "integer", "minimum": 1},
                           {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 2, "maxItems": 2}]},
        "scale": {"type": "number"},
        "mean": {"type": "array", "items": {"type": "number"}, "minItems": 1},
        "std": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0}, "minItems": 1},
        "layout": {"enum": ["NCHW", "NHWC"]},
        "color": {"enum": ["RGB", "BGR"]},
    },
}
_POSTPROCESS = {
    "type": "object", "additionalProperties": False, "required": ["kind"],
    "properties": {
        "kind": {"enum": ["classification", "none"]},
        "top_k": {"type": "integer", "minimum": 1},
        "softmax": {"type": "boolean"},
        "labels": {"type": "string"},
    },
}
SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["model"],
    "properties": {
        "model": {
            "type": "object", "additionalProperties": False, "required": ["framework"],
            "properties": {
                "framework": {"enum": ["pytorch", "tensorflow", "onnx"]},
                "saved_model": {"type": "string"},   # tensorflow: a SavedModel directory
                "onnx": {"type": "string"},          # onnx: a .onnx file
                "name": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
                "source": {"type": "string"},
                "module": {"type": "string", "pattern": r"^[A-Za-z_][\w.]*$"},
                "entry": {"type": "string", "pattern": r"^[A-Za-z_]\w*$"},
                "python_path": {"type": "array", "items": {"type": "string"}},
                "checkpoint": {"type": "string", "minLength": 1},  # pytorch: a state dict loaded into the entry's model
            },
            "oneOf": [{"required": ["source"]}, {"required": ["module"]}, {"required": ["saved_model"]},
                      {"required": ["onnx"]}],
            "if": {"anyOf": [{"required": ["source"]}, {"required": ["module"]}]}, "then": {"required": ["entry"]},
        },
        "inputs": {
            "type": "array", "minItems": 1,
            "items": {
                "type": "object", "additionalProperties": False, "required": ["name", "shape"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    # ints, or the name of a symbolic dim declared under `dims`
                    "shape": {"type": "array", "items": {"type": ["integer", "string"], "minimum": 1,
                                                         "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"}},
                    "dtype": {"enum": DTYPES},
                    "preprocess": _PREPROCESS,
                },
            },
        },
        # Symbolic dims: name -> [min, max] (the shapes a run may use; memory is planned for max).
        "dims": {
            "type": "object",
            "propertyNames": {"pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
            "additionalProperties": {"type": "array", "minItems": 2, "maxItems": 2,
                                     "items": {"type": "integer", "minimum": 1}},
        },
        # Shapes to compile also with their dims fixed (runs with those values use that code).
        "specialize": {
            "type": "array",
            "items": {"type": "object", "minProperties": 1,
                      "additionalProperties": {"type": "integer", "minimum": 1}},
        },
        "outputs": {
            "type": "array",
            "items": {
                "type": "object", "additionalProperties": False, "required": ["name"],
                "properties": {"name": {"type": "string"}, "postprocess": _POSTPROCESS},
            },
        },
        "target": {
            "type": "object", "additionalProperties": False,
            "properties": {"arch": {"enum": TARGETS}, "cpu": {"type": "string"},
                           "features": {"type": "string"}},
        },
        "quantization": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "method": {"enum": list(QUANTIZATION_METHODS)},
                "weight": {"type": "object", "additionalProperties": False, "required": ["dtype"],
                           "properties": {"dtype": {"enum": ["f16", "int8", "int4"]},
                                          "scheme": {"enum": ["symmetric", "asymmetric"]},
                                          "granularity": {"enum": ["per_tensor", "per_channel", "per_block"]}}},
                "activation": {"type": "object", "additionalProperties": False,
                               "properties": {"dtype": {"enum": ["uint8", "int8"]},
                                              "scheme": {"enum": ["symmetric", "asymmetric"]},
                                              "granularity": {"enum": ["per_tensor"]}}},
                "qat_mode": {"type": "boolean"},
                "keep_f32": {"type": "integer", "minimum": 0},
                "calibration": {"type": "object", "additionalProperties": False,
                                "properties": {"files": {"type": "array", "items": {"type": "string"}},
                                               "generator": {"type": "string", "pattern": r"^[\w.]+:\w+$"},
                                               "ranges": {"enum": list(RANGES)},
                                               "percentile": {"type": "number", "exclusiveMinimum": 50,
                                                              "maximum": 100}}},
            },
        },
        # bf16: conv2d / matmul in bfloat16 with f32 accumulation (AVX-512-BF16 where the target has it)
        "precision": {"enum": list(PRECISIONS)},
        "plugin": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "modules": {"type": "array", "items": {"type": "string", "pattern": r"\.(c|o|a)$"}},
                "postprocess": {"type": "object", "additionalProperties": False, "required": ["plugin"],
                                "properties": {"plugin": {"type": "string", "pattern": _C_NAME},
                                               "options": _OPTIONS}},
                "custom_ops": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False, "required": ["op", "symbol"],
                    "properties": {"op": {"type": "string", "pattern": r"^\w+::\w+$"},
                                   "symbol": {"type": "string", "pattern": _C_NAME}}}},
            },
        },
        "optimize": {
            "type": "object", "additionalProperties": False,
            "properties": {"threads": {"type": "integer", "minimum": 1, "maximum": 256},
                           "fuse": {"type": "boolean"}},
        },
        "build": {
            "type": "object", "additionalProperties": False,
            "properties": {"artifact": {"enum": ARTIFACTS}},
        },
    },
}


def _override_schema() -> dict:
    """An `overrides` entry: `when` plus any section but model, with inputs/outputs
    entries that need only their name (they merge into the base entry)."""
    props = {k: v for k, v in SCHEMA["properties"].items() if k != "model"}
    for key, optional in (("inputs", "preprocess"), ("outputs", "postprocess")):
        item = props[key]["items"]
        item_props = dict(item["properties"], **{optional: {"anyOf": [{"type": "null"}, item["properties"][optional]]}})
        props[key] = dict(props[key], items=dict(item, required=["name"], properties=item_props))
    target = dict(props["target"], properties={k: v for k, v in props["target"]["properties"].items()
                                               if k != "arch"})
    props["target"] = target
    names = {"enum": TARGETS}
    props["when"] = {"type": "object", "additionalProperties": False, "required": ["target"],
                     "properties": {"target": {"oneOf": [names, {"type": "array", "items": names,
                                                                  "minItems": 1}]}}}
    return {"type": "object", "additionalProperties": False, "required": ["when"], "properties": props}


SCHEMA["properties"]["overrides"] = {"type": "array", "items": _override_schema()}

_LATER: dict = {}  # (section, key) -> message for schema values accepted in a later release


def _line_of(node, keys) -> int:
    """1-based line of the node at `keys` (as deep as it exists)."""
    line = node.start_mark.line + 1
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == key:
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _key_name(keys) -> str:
    out = ""
    for k in keys:
        if not isinstance(k, int):  # an unknown key may be long, or hold a newline
            k = str(k) if str(k).isprintable() and len(str(k)) <= 40 else short(str(k))
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "(top level)"


@dataclass
class Config:
    path: Path              # the config file
    data: dict              # validated contents, with the overrides for `target` applied
    node: Any               # composed YAML (for line numbers)
    target: str = "host"    # the build's target (the --target option, else target.arch)
    applied: tuple = ()     # indices of the overrides entries applied
    base_data: dict | None = None  # the contents before the overrides (without them)

    @property
    def base(self) -> Path:
        return self.path.parent

    def line(self, *keys) -> str:
        return f"{self.path}:{_line_of(self.node, keys)}"

    def error(self, keys, message: str) -> ConfigError:
        return ConfigError(f"{self.line(*keys)}: {_key_name(keys)}: {message}")

    def resolve(self, rel: str) -> Path:
        p = Path(rel)
        return p if p.is_absolute() else (self.base / p)

    @property
    def name(self) -> str:
        m = self.data["model"]
        if "name" in m:
            return m["name"]
        stem = Path(m.get("source") or m.get("onnx") or m.get("saved_model", "").rstrip("/\\")
                    or m["module"].rsplit(".", 1)[-1]).stem
        return "".join(c if c.isalnum() or c == "_" else "_" for c in stem) or "model"

    def section_hash(self, *sections: str) -> str:
        """Hash of the named top-level sections (canonical JSON), for cache keys."""
        blob = json.dumps({s: self.data.get(s) for s in sections}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def same_target(a: str, b: str) -> bool:
    norm = {"host": HOST_TARGET}
    return norm.get(a, a) == norm.get(b, b)


def _merge(base, extra):
    """`extra` over `base`: mappings key by key, named lists by name, other values replaced."""
    if isinstance(base, dict) and isinstance(extra, dict):
        out = dict(base)
        for k, v in extra.items():
            if v is None:  # `key: null` removes the key (e.g. an input's preprocess)
                out.pop(k, None)
            else:
                out[k] = _merge(base[k], v) if k in base else v
        return out
    if isinstance(base, list) and isinstance(extra, list) and base and \
            all(isinstance(x, dict) and "name" in x for x in base + extra):
        out = [dict(x) for x in base]
        for e in extra:
            i = next((i for i, x in enumerate(out) if x["name"] == e["name"]), None)
            if i is None:
                raise KeyError(e["name"])
            out[i] = _merge(out[i], e)
        return out
    return extra


def _first_error(data, schema):
    import jsonschema
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data),
                    key=lambda e: (list(map(str, e.absolute_path)), e.message))
    return errors[0] if errors else None


def _raise_schema_error(cfg: "Config", e, prefix=()) -> None:
    keys = list(prefix) + list(e.absolute_path)
    if e.validator == "additionalProperties":
        extra = sorted(set(e.instance) - set(e.schema.get("properties", {})))
        keys = keys + extra[:1]
        raise cfg.error(keys, f"unknown key (allowed: {', '.join(sorted(e.schema['properties']))})")
    if e.validator == "oneOf" and keys == ["model"]:
        raise cfg.error(keys, "give exactly one of 'source' (a Python file) or 'module' (a module name) with "
                              "'entry', 'saved_model' (a TensorFlow SavedModel directory) or 'onnx' (a .onnx file)")
    if e.validator == "oneOf" and keys[-2:] == ["when", "target"]:
        raise cfg.error(keys, f"{short(e.instance)} is not a target or a list of targets (targets: {', '.join(TARGETS)})")
    if e.validator == "pattern" and keys[:2] == ["plugin", "modules"]:
        raise cfg.error(keys, f"{short(e.instance)}: plugin modules are C files (.c), objects (.o) or archives (.a)")
    later = _LATER.get(tuple(k for k in keys if isinstance(k, str))[-2:])
    raise cfg.error(keys, later or _schema_message(e))


def _schema_message(e) -> str:
    """jsonschema's message with the value cut short (it embeds the whole repr)."""
    message, whole = e.message, repr(e.instance)
    if len(whole) > 40 and whole in message:
        message = message.replace(whole, short(e.instance))
    return message if len(message) <= 300 else message[:300] + ".."


def _apply_overrides(cfg: "Config") -> None:
    """Merge the overrides entries that match cfg.target into cfg.data, and validate."""
    base = {k: v for k, v in cfg.data.items() if k != "overrides"}
    base_arch = (base.get("target") or {}).get("arch", "host")
    if not same_target(cfg.target, base_arch) and base.get("target"):
        # target.cpu/features describe the config's own arch, not another --target
        base["target"] = {"arch": cfg.target}
    data, applied = base, []
    for i, entry in enumerate(cfg.data.get("overrides") or []):
        when = entry["when"]["target"]
        if not any(same_target(cfg.target, t) for t in ([when] if isinstance(when, str) else when)):
            continue
        for section, value in entry.items():
            if section == "when":
                continue
            try:
                data = dict(data, **{section: _merge(data[section], value) if section in data else value})
            except KeyError as e:
                raise cfg.error(["overrides", i, section], f"names {short(e.args[0])}, which is not in the base "
                                f"config's {section}") from None
        applied.append(i)
    if applied:
        e = _first_error(data, SCHEMA)
        if e is not None:
            section = next((k for k in e.absolute_path), None)
            i = next((i for i in reversed(applied) if section in cfg.data["overrides"][i]), applied[-1])
            keys = list(e.absolute_path)
            raise cfg.error(["overrides", i, *keys[:1]],
                            f"with this override for target {cfg.target}: {_key_name(keys)}: {e.message}")
    cfg.base_data = base
    cfg.data = data
    cfg.applied = tuple(applied)


def load_config(path: str | Path, target: str | None = None, model_files: bool = True) -> Config:
    """Read and validate a config file for a target (default: its target.arch, else
    host); raise ConfigError naming key and file:line. `model_files=False` (the
    compile stage, which reads the captured bundle) does not look for the model's
    own files (`source`, `python_path`, `saved_model`, `onnx`)."""

    path = Path(path)
    node, data = compose_config(path)
    if node is None:
        raise ConfigError(f"{path}:1: the config file is empty")
    cfg = Config(path, data, node)
    e = _first_error(data, SCHEMA)
    if e is not None:
        _raise_schema_error(cfg, e)
    _check_not_empty(cfg)
    if target is not None and target not in TARGETS:
        raise ConfigError(f"target {target!r} is not supported (targets: {', '.join(TARGETS)})")
    cfg.target = target or (data.get("target") or {}).get("arch", "host")
    _apply_overrides(cfg)
    try:
        _check_files(cfg, model_files)
    except ConfigError as e:
        if not cfg.applied:
            raise
        where = ", ".join(f"overrides[{i}] at {cfg.line('overrides', i)}" for i in cfg.applied)
        raise ConfigError(f"{e} (with the overrides for target {cfg.target}: {where})") from None
    return cfg


def _plugin_names(path: Path) -> set[str]:
    """Names a C plugin module defines with CUVIL_PLUGIN(name, ...) (for early errors)."""
    import re
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return set()
    return set(re.findall(r"^\s*CUVIL_PLUGIN\(\s*([A-Za-z_]\w*)", text, re.M))


def _check_plugins(cfg: Config) -> None:
    plugin = cfg.data.get("plugin") or {}
    defined: dict[str, Path] = {}
    only_c = True
    for i, m in enumerate(plugin.get("modules", [])):
        path = cfg.resolve(m)
        if not path.is_file():
            raise cfg.error(["plugin", "modules", i], f"file not found: {path}")
        only_c = only_c and path.suffix == ".c"
        for name in _plugin_names(path) if path.suffix == ".c" else ():
            defined[name] = path
    uses = [(["plugin", "postprocess", "plugin"], (plugin.get("postprocess") or {}).get("plugin"))]
    for i, inp in enumerate(cfg.data.get("inputs", [])):
        pre = inp.get("preprocess") or {}
        if pre.get("kind") == "plugin":
            if "plugin" not in pre:
                raise cfg.error(["inputs", i, "preprocess"], "kind 'plugin' needs 'plugin: NAME' (a plugin module's "
                                "CUVIL_PLUGIN name)")
            extra = sorted(set(pre) - {"kind", "plugin", "options"})
            if extra:
                raise cfg.error(["inputs", i, "preprocess", extra[0]], "is an image pre-processing key; a plugin "
                                "takes its settings in 'options'")
            uses.append((["inputs", i, "preprocess", "plugin"], pre["plugin"]))
        elif "plugin" in pre or "options" in pre:
            key = "plugin" if "plugin" in pre else "options"
            raise cfg.error(["inputs", i, "preprocess", key], "only for kind 'plugin'")
    for keys, name in uses:
        if name is None:
            continue
        if not plugin.get("modules"):
            raise cfg.error(keys, f"names the plugin {short(name)}, but plugin.modules lists no module")
        if only_c and name not in defined:
            known = ", ".join(sorted(defined)) or "none"
            raise cfg.error(keys, f"no module in plugin.modules defines CUVIL_PLUGIN({name}, ...) (defined: {known})")


def _check_dims(cfg: Config) -> None:
    """Every symbolic input dim is declared under `dims` with min <= max, and every declared
    dim is used (PyTorch: torch.export makes them symbolic; ONNX: the model's dim_params)."""
    dims = cfg.data.get("dims") or {}
    for name, (lo, hi) in dims.items():
        if lo > hi:
            raise cfg.error(["dims", name], f"min {lo} is larger than max {hi}")
    used = set()
    for i, inp in enumerate(cfg.data.get("inputs", [])):
        for k, d in enumerate(inp["shape"]):
            if isinstance(d, str):
                if d not in dims:
                    raise cfg.error(["inputs", i, "shape", k], f"the symbolic dim {short(d)} is not declared under "
                                    f"'dims' (add `dims: {{{d}: [min, max]}}`)")
                used.add(d)
    for name in sorted(set(dims) - used):
        raise cfg.error(["dims", name], f"the dim {short(name)} is not used by any input's shape")
    for i, spec in enumerate(cfg.data.get("specialize") or []):
        for name, value in spec.items():
            if name not in dims:
                raise cfg.error(["specialize", i, name], f"{short(name)} is not one of the dims ({', '.join(dims) or 'none'})")
            if not dims[name][0] <= value <= dims[name][1]:
                raise cfg.error(["specialize", i, name], f"{value} is outside the bounds {dims[name]} of {name!r}")
    if dims and cfg.data["model"]["framework"] == "tensorflow":
        raise cfg.error(["dims"], "symbolic dims are supported for PyTorch (torch.export) and ONNX models "
                        "(their dim_params), not for TensorFlow yet")


def _check_not_empty(cfg: Config) -> None:
    """A section given with nothing in it is a mistake, not a default; a Python model
    (`source` or `module`) needs `inputs` (ONNX and SavedModel files declare theirs)."""
    for key, value in cfg.data.items():
        if value in (None, {}, []):
            raise cfg.error([key], "is empty: fill it in or remove it")
    m = cfg.data["model"]
    if ("source" in m or "module" in m) and "inputs" not in cfg.data:
        raise cfg.error(["model"], "the config has no 'inputs': list the model's inputs "
                        "(name, shape, dtype) under 'inputs'")


def _check_files(cfg: Config, model_files: bool = True) -> None:
    from .quant_config import quantization_from_config
    _check_plugins(cfg)
    quantization_from_config(cfg)  # method / weight / activation / precision agree; calibration files exist
    m = cfg.data["model"]
    _check_model_source(cfg, m, model_files)
    if model_files:
        if "source" in m and not cfg.resolve(m["source"]).is_file():
            raise cfg.error(["model", "source"], f"file not found: {cfg.resolve(m['source'])}")
        for i, p in enumerate(m.get("python_path", [])):
            if not cfg.resolve(p).is_dir():
                raise cfg.error(["model", "python_path", i], f"directory not found: {cfg.resolve(p)}")
    for i, out in enumerate(cfg.data.get("outputs", [])):
        labels = (out.get("postprocess") or {}).get("labels")
        if labels and not cfg.resolve(labels).is_file():
            raise cfg.error(["outputs", i, "postprocess", "labels"], f"file not found: {cfg.resolve(labels)}")
    names = [i["name"] for i in cfg.data.get("inputs", [])]
    if len(set(names)) != len(names):
        raise cfg.error(["inputs"], "input names must be unique")
    _check_dims(cfg)
    for i, inp in enumerate(cfg.data.get("inputs", [])):
        pre = inp.get("preprocess")
        if pre and pre["kind"] == "image":
            shape = inp["shape"]
            if len(shape) != 4:
                raise cfg.error(["inputs", i, "shape"], "an image input needs a 4-D shape")
            for key in ("mean", "std"):
                if key in pre and len(pre[key]) not in (1, 3):
                    raise cfg.error(["inputs", i, "preprocess", key], "give 1 or 3 values")


def _check_model_source(cfg: Config, m: dict, model_files: bool = True) -> None:
    """The model source suits the framework, and the SavedModel / .onnx file exists
    (when `model_files`)."""
    fw = m["framework"]
    key = next(k for k in ("source", "module", "saved_model", "onnx") if k in m)
    allowed = {"pytorch": ("source", "module"), "tensorflow": ("source", "module", "saved_model"),
               "onnx": ("onnx",)}[fw]
    if key not in allowed:
        raise cfg.error(["model", key], f"framework {fw} takes {' or '.join(repr(k) for k in allowed)}, not {key!r}")
    if "entry" in m and key in ("saved_model", "onnx"):
        raise cfg.error(["model", "entry"], f"'entry' goes with 'source' or 'module', not with {key!r}")
    if "checkpoint" in m and fw != "pytorch":
        raise cfg.error(["model", "checkpoint"], f"a state dict checkpoint is for framework pytorch, not {fw}")
    if "checkpoint" in m and model_files and not cfg.resolve(m["checkpoint"]).is_file():
        raise cfg.error(["model", "checkpoint"], f"file not found: {cfg.resolve(m['checkpoint'])}")
    if not model_files:
        return
    if key == "saved_model" and not (cfg.resolve(m[key]) / "saved_model.pb").is_file():
        raise cfg.error(["model", key], f"not a SavedModel directory (no saved_model.pb): {cfg.resolve(m[key])}")
    if key == "onnx" and not cfg.resolve(m[key]).is_file():
        raise cfg.error(["model", key], f"file not found: {cfg.resolve(m[key])}")
