"""`config.yaml`: one build's declarative description, validated before any work.

The YAML is read with `yaml.safe_load`-equivalent composing that keeps node marks, checked
against a JSON schema (jsonschema), then checked for the files it names. Every error
names the key and the file:line where it was written.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import CuvilError

DTYPES = ["f32", "f16", "f64", "i64", "i32", "i8", "u8", "bool"]
TARGETS = ["host", "x86_64-linux-gnu"]  # other targets arrive with the cross-target work
QUANT_METHODS = ["none"]                # fp16 / int8_sym / int4_block arrive with quantization
ARTIFACTS = ["executable", "shared", "static"]

_PREPROCESS = {
    "type": "object", "additionalProperties": False, "required": ["kind"],
    "properties": {
        "kind": {"enum": ["image"]},
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
            "type": "object", "additionalProperties": False, "required": ["framework", "entry"],
            "properties": {
                "framework": {"enum": ["pytorch"]},
                "name": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
                "source": {"type": "string"},
                "module": {"type": "string", "pattern": r"^[A-Za-z_][\w.]*$"},
                "entry": {"type": "string", "pattern": r"^[A-Za-z_]\w*$"},
                "python_path": {"type": "array", "items": {"type": "string"}},
            },
            "oneOf": [{"required": ["source"]}, {"required": ["module"]}],
        },
        "inputs": {
            "type": "array", "minItems": 1,
            "items": {
                "type": "object", "additionalProperties": False, "required": ["name", "shape"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "shape": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                    "dtype": {"enum": DTYPES},
                    "preprocess": _PREPROCESS,
                },
            },
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
            "properties": {"method": {"enum": QUANT_METHODS}},
        },
        "plugin": {
            "type": "object", "additionalProperties": False,
            "properties": {"modules": {"type": "array", "items": {"type": "string"}, "maxItems": 0}},
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

_LATER = {
    ("plugin", "modules"): "plugin modules are not supported yet (they arrive with the plugin work)",
    ("target", "arch"): "only the host target is supported for now; cross targets arrive later",
    ("quantization", "method"): "only quantization method 'none' is supported for now",
}


class ConfigError(CuvilError):
    """A config problem, with the key and file:line in the message."""


class _MarkedLoader(yaml.SafeLoader):
    """SafeLoader that records each mapping's and sequence's node marks."""


def _compose(text: str, path: str):
    try:
        return yaml.compose(text, Loader=_MarkedLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise ConfigError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from None


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
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "(top level)"


@dataclass
class Config:
    path: Path              # the config file
    data: dict              # validated contents
    node: Any               # composed YAML (for line numbers)

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
        stem = Path(m.get("source") or m["module"].rsplit(".", 1)[-1]).stem
        return "".join(c if c.isalnum() or c == "_" else "_" for c in stem) or "model"

    def section_hash(self, *sections: str) -> str:
        """Hash of the named top-level sections (canonical JSON), for cache keys."""
        blob = json.dumps({s: self.data.get(s) for s in sections}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def load_config(path: str | Path) -> Config:
    """Read and validate a config file; raise ConfigError naming key and file:line."""
    import jsonschema

    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read config file: {e}") from None
    node = _compose(text, str(path))
    if node is None:
        raise ConfigError(f"{path}:1: the config file is empty")
    data = yaml.load(text, Loader=yaml.SafeLoader)
    cfg = Config(path, data, node)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        e = errors[0]
        keys = list(e.absolute_path)
        if e.validator == "additionalProperties":
            extra = sorted(set(e.instance) - set(e.schema.get("properties", {})))
            keys = keys + extra[:1]
            raise cfg.error(keys, f"unknown key (allowed: {', '.join(sorted(e.schema['properties']))})")
        if e.validator == "oneOf" and keys == ["model"]:
            raise cfg.error(keys, "give exactly one of 'source' (a Python file) or 'module' (a module name)")
        later = _LATER.get(tuple(k for k in keys if isinstance(k, str))[-2:])
        raise cfg.error(keys, later or e.message)
    _check_files(cfg)
    return cfg


def _check_files(cfg: Config) -> None:
    m = cfg.data["model"]
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
    for i, inp in enumerate(cfg.data.get("inputs", [])):
        pre = inp.get("preprocess")
        if pre and pre["kind"] == "image":
            shape = inp["shape"]
            if len(shape) != 4:
                raise cfg.error(["inputs", i, "shape"], "an image input needs a 4-D shape")
            for key in ("mean", "std"):
                if key in pre and len(pre[key]) not in (1, 3):
                    raise cfg.error(["inputs", i, "preprocess", key], "give 1 or 3 values")
