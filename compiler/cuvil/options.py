"""One compilation's options: `CompileOptions`, with its `Quantization` and `TargetSpec`.

These are the only lists of what a compilation can be asked for: the quantization
methods, the precisions, the activation codes and the calibration ranges. The Python
API (`cuvil.compile(quantization=...)`), the CLI choices, the config schema
(config.py, quant_config.py) and the Bazel rule's allowed values (a test checks
rules/private/model.bzl) all read them from here.

`cuvil build` and `cuvil compile` make a `CompileOptions` from the config
(`build.compile_options`); `cuvil.compile` makes one from its arguments. Its JSON form
(`to_json`, sorted keys) is part of the compile stage's cache key.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .errors import CuvilError

QUANTIZATION_METHODS = ("none", "fp16", "int4_block", "int8_sym")
PRECISIONS = ("f32", "bf16")
ACTIVATIONS = ("u8", "i8")          # int8_sym activation codes: u8 asymmetric, i8 symmetric
RANGES = ("minmax", "percentile")   # how calibration picks activation ranges (passes/calibrate.py)
CALIBRATED = ("int8_sym", "int4_block")  # methods that use calibration inputs (int4_block: optional)


@dataclass(frozen=True)
class CalibrationFiles:
    """Calibration inputs named by a config: files as (path, sha256) pairs, and a
    generator `module:function` yielding input tuples. They become arrays only when
    the compile stage loads them (`quant_config.calibration_inputs`)."""
    files: tuple[tuple[str, str], ...] = ()
    generator: str | None = None

    def to_json(self) -> dict:
        return {"files": [{"path": p, "sha256": h} for p, h in self.files], "generator": self.generator}


def _input_tuples(calibration) -> tuple:
    """API calibration (an iterable of input tuples, or of single arrays) as a tuple of
    tuples of arrays."""
    import numpy as np
    try:
        return tuple(tuple(np.asarray(a) for a in (c if isinstance(c, (tuple, list)) else (c,)))
                     for c in calibration)
    except TypeError:
        raise CuvilError(f"quantization calibration must be an iterable of input tuples (NumPy arrays), "
                         f"got {type(calibration).__name__}") from None


def _one_of(what: str, value, allowed) -> None:
    if value not in allowed:
        raise CuvilError(f"{what} {value!r} is not supported (supported: {', '.join(allowed)})")


@dataclass(frozen=True)
class Quantization:
    """How weights and compute are narrowed.

    method: none | fp16 | int4_block | int8_sym (QUANTIZATION_METHODS).
    precision: f32 | bf16: bf16 runs conv2d / matmul in bfloat16 with f32
      accumulation (method none only).
    calibration: the inputs int8_sym finds activation ranges on (int4_block: optional,
      fits matmul codes GPTQ-style): input tuples of NumPy arrays, or a config's
      `CalibrationFiles`.
    qat: the model is pre-quantized (PT2E quantize/dequantize nodes): its own scales,
      no calibration; method none or int8_sym.
    activation: int8_sym activation codes, u8 or i8 ("": u8, or for qat whatever the
      graph has). ranges / percentile: how calibration picks them. keep_f32: this many
      most sensitive int8 ops stay f32.
    """
    method: str = "none"
    precision: str = "f32"
    calibration: CalibrationFiles | tuple = ()
    qat: bool = False
    activation: str = ""
    ranges: str = "minmax"
    percentile: float = 99.99
    keep_f32: int = 0

    def __post_init__(self):
        _one_of("quantization method", self.method, QUANTIZATION_METHODS)
        _one_of("precision", self.precision, PRECISIONS)
        if self.activation:
            _one_of("activation", self.activation, ACTIVATIONS)
        _one_of("calibration ranges", self.ranges, RANGES)
        if isinstance(self.percentile, bool) or not isinstance(self.percentile, (int, float)) \
                or not 50 < self.percentile <= 100:
            raise CuvilError(f"percentile must be a number in (50, 100], got {self.percentile!r}")
        if isinstance(self.keep_f32, bool) or not isinstance(self.keep_f32, int) or self.keep_f32 < 0:
            raise CuvilError(f"keep_f32 must be an integer >= 0, got {self.keep_f32!r}")
        if not isinstance(self.calibration, CalibrationFiles):
            calibration = () if self.calibration is None else self.calibration
            object.__setattr__(self, "calibration", _input_tuples(calibration))
        if self.precision == "bf16" and self.method != "none":
            raise CuvilError(f"precision bf16 computes in bfloat16 with its own bf16 weights; it does not "
                             f"combine with quantization {self.method!r} (use one or the other)")
        if self.qat and (self.method not in ("none", "int8_sym") or self.has_calibration or self.keep_f32):
            raise CuvilError("qat takes the scales from the model's quantize/dequantize nodes: use method "
                             "'none' or 'int8_sym', no calibration and no keep_f32")

    @classmethod
    def of(cls, value: str | Quantization | None) -> Quantization:
        """A method name (`"int8_sym"`) or a Quantization as a Quantization."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(value)
        raise CuvilError(f"quantization must be a method name ({', '.join(QUANTIZATION_METHODS)}) or a "
                         f"cuvil.options.Quantization, got {type(value).__name__}")

    @property
    def has_calibration(self) -> bool:
        c = self.calibration
        return bool(c.files or c.generator) if isinstance(c, CalibrationFiles) else bool(c)

    @property
    def needs_calibration(self) -> bool:
        """int8_sym finds its activation ranges on calibration inputs (unless qat)."""
        return self.method == "int8_sym" and not self.qat

    @property
    def weights_method(self) -> str:
        """The quantize-weights pass's method: none for qat (the graph's own int8 ops)."""
        return "none" if self.qat else self.method

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "calibration"}
        c = self.calibration
        if isinstance(c, CalibrationFiles):
            out["calibration"] = c.to_json()
        else:  # arrays: their content
            import numpy as np
            h = hashlib.sha256()
            for row in c:
                for a in row:
                    h.update(f"{a.dtype}{a.shape}".encode() + np.ascontiguousarray(a).tobytes())
            out["calibration"] = {"inputs": len(c), "sha256": h.hexdigest()}
        return out


@dataclass(frozen=True)
class TargetSpec:
    """The target a compilation asks for, before it is resolved on the compiling machine
    (`backend.llvm.target.resolve_target`): a Cuvil target name (host,
    x86_64-linux-gnu, aarch64-linux-gnu, wasm32-wasi) and optional LLVM cpu / features."""
    arch: str = "host"
    cpu: str = ""
    features: str = ""

    def resolve(self):
        """The backend.llvm.target.Target this names."""
        from .backend.llvm.target import resolve_target
        return resolve_target(self.arch, self.cpu, self.features)

    def to_json(self) -> dict:
        return {"arch": self.arch, "cpu": self.cpu, "features": self.features}


@dataclass(frozen=True)
class CompileOptions:
    """Everything the compile stage's output depends on besides the model.

    name: the C prefix of the generated code. output_names: names for the model's
    outputs (empty: the model's own). preprocess / postprocess: input / output name ->
    its pre/post-processing section (the manifest's). calibration_preprocess: the
    preprocess calibration images go through where it differs (None: preprocess).
    postprocess_plugin: {plugin, options} or None. custom_ops: the C symbols of the
    config's custom ops. threads: the default thread count of the artifact. fuse:
    fuse epilogues into conv2d / matmul. specialize: dim values to compile also with
    the dims fixed.
    """
    name: str = "cuvil_model"
    output_names: tuple[str, ...] = ()
    preprocess: dict = field(default_factory=dict)
    calibration_preprocess: dict | None = None
    postprocess: dict = field(default_factory=dict)
    postprocess_plugin: dict | None = None
    custom_ops: tuple[str, ...] = ()
    target: TargetSpec = TargetSpec()
    quantization: Quantization = Quantization()
    threads: int = 1
    fuse: bool = True
    specialize: tuple[dict, ...] = ()

    def __post_init__(self):
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise CuvilError(f"threads must be a positive integer, got {self.threads!r}")
        for name in ("output_names", "custom_ops", "specialize"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def replace(self, **changes) -> CompileOptions:
        return replace(self, **changes)

    def to_json(self) -> dict:
        """Plain data with sorted keys (for the cache key and for reading)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.to_json() if hasattr(v, "to_json") else list(v) if isinstance(v, tuple) else v
        return json.loads(json.dumps(out, sort_keys=True))

    def json(self) -> str:
        """The stable JSON text of `to_json` (sorted keys, no spaces)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
