"""Elementwise ops (unary, binary with broadcasting, where, cast) and the fused-chain op.

A *program* is the body of a fused elementwise op or of a conv/matmul epilogue: a list
of instructions `[op, [slot, ...], {attrs}]` where slots 0..n-1 are the op's inputs and
slot n+k is instruction k's result; the last instruction's result is the output.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import VerifyError
from ..core import OP_REGISTRY, Op
from ..types import FLOAT_DTYPES, TensorType, broadcast_shapes
from .quant import fake_quant

try:  # SciPy's erf is vectorized (7x faster than math.erf per element on BERT's GELUs, which
    # dominate int8 calibration); both are double precision, equal after rounding to f32.
    from scipy.special import erf as _erf
except ImportError:  # SciPy is optional: the compiler itself needs only NumPy
    _erf = np.vectorize(math.erf, otypes=[np.float64])


def _f(x: np.ndarray, fn) -> np.ndarray:
    """Compute `fn` in float64 and return it in x's dtype (a precise reference)."""
    return fn(x.astype(np.float64)).astype(x.dtype)


def _gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _quiet(fn):
    """fn without NumPy's warning for NaN results (sin(inf) is NaN, as in torch)."""
    def quiet(x):
        with np.errstate(invalid="ignore"):
            return fn(x)
    return quiet


def _clamp(x, min=None, max=None):
    if min is not None:
        x = np.maximum(x, min)
    if max is not None:
        x = np.minimum(x, max)
    return x


# name -> float64 NumPy function of (x, **attrs)
_UNARY_FNS = {
    "neg": lambda x: -x,
    "abs": np.abs,
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "gelu": _gelu,
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "hardswish": lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "hardsigmoid": lambda x: np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "clamp": _clamp,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "exp": np.exp,
    "log": np.log,
    "erf": _erf,
    "sin": _quiet(np.sin),
    "cos": _quiet(np.cos),
    "reciprocal": lambda x: 1.0 / x,
    "elu": lambda x, alpha=1.0: np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0))),
    "leaky_relu": lambda x, slope=0.01: np.where(x > 0, x, x * slope),
    # a quantize-dequantize pair of a pre-quantized graph (attrs: quant.fake_quant's act_quant)
    "fake_quant": lambda x, **aq: fake_quant(x.astype(np.float32), aq),
}

_BINARY_FNS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "pow": np.power, "maximum": np.maximum, "minimum": np.minimum,
}
_COMPARE_FNS = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}
_LOGIC_FNS = {"and": np.logical_and, "or": np.logical_or}


class Unary(Op):
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        (t,) = types
        if t.dtype not in FLOAT_DTYPES and cls.name not in ("cuvil.neg", "cuvil.abs", "cuvil.clamp"):
            raise VerifyError(f"{cls.name} needs a float operand, got {t}")
        return [TensorType(t.shape, t.dtype)]

    @classmethod
    def reference(cls, args, attrs):
        (x,) = args
        fn = _UNARY_FNS[cls.name.split(".", 1)[1]]
        if x.dtype.kind != "f":
            return [np.asarray(fn(x, **attrs)).astype(x.dtype)]
        return [np.asarray(_f(x, lambda v: fn(v, **attrs)))]


class Binary(Op):
    num_operands = 2
    result_bool = False

    @classmethod
    def infer_types(cls, types, attrs):
        a, b = types
        if a.dtype != b.dtype:
            raise VerifyError(f"{cls.name}: operand dtypes differ ({a.dtype} vs {b.dtype})")
        shape = broadcast_shapes(a.shape, b.shape)
        return [TensorType(shape, "bool" if cls.result_bool else a.dtype)]

    @classmethod
    def reference(cls, args, attrs):
        a, b = args
        key = cls.name.split(".", 1)[1]
        fn = _BINARY_FNS.get(key) or _COMPARE_FNS.get(key) or _LOGIC_FNS[key]
        if key in _BINARY_FNS and a.dtype.kind == "f":
            return [fn(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)]
        if key == "div":  # integer division: torch's true division is canonicalised to floats
            return [np.floor_divide(a, b)]
        return [np.asarray(fn(a, b))]


class Where(Op):
    name = "cuvil.where"
    num_operands = 3

    @classmethod
    def infer_types(cls, types, attrs):
        c, a, b = types
        if c.dtype != "bool":
            raise VerifyError(f"cuvil.where condition must be bool, got {c.dtype}")
        if a.dtype != b.dtype:
            raise VerifyError(f"cuvil.where branches differ in dtype ({a.dtype} vs {b.dtype})")
        return [TensorType(broadcast_shapes(c.shape, a.shape, b.shape), a.dtype)]

    @classmethod
    def reference(cls, args, attrs):
        c, a, b = args
        return [np.where(c, a, b).astype(a.dtype)]


class Cast(Op):
    name = "cuvil.cast"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        return [TensorType(types[0].shape, attrs["dtype"])]

    @classmethod
    def reference(cls, args, attrs):
        from ..types import DTYPES
        return [args[0].astype(DTYPES[attrs["dtype"]])]


def _define(base, names, extra=None):
    for n in names:
        type(f"Op_{n}", (base,), {"name": f"cuvil.{n}", **(extra or {})})


_define(Unary, _UNARY_FNS)
_define(Binary, _BINARY_FNS)
_define(Binary, _COMPARE_FNS, {"result_bool": True})
_define(Binary, _LOGIC_FNS)

UNARY = frozenset(f"cuvil.{n}" for n in _UNARY_FNS)
BINARY = frozenset(f"cuvil.{n}" for n in (*_BINARY_FNS, *_COMPARE_FNS, *_LOGIC_FNS))
COMPARE = frozenset(f"cuvil.{n}" for n in _COMPARE_FNS)
ELEMENTWISE = UNARY | BINARY | {"cuvil.where", "cuvil.cast"}


# -- programs: fused chains --------------------------------------------------------------
def _check_program(program, n_inputs: int) -> None:
    if not isinstance(program, list) or not program:
        raise VerifyError("program must be a non-empty list of instructions")
    for k, ins in enumerate(program):
        if not (isinstance(ins, list) and len(ins) == 3 and isinstance(ins[0], str)
                and isinstance(ins[1], list) and isinstance(ins[2], dict)):
            raise VerifyError(f"program instruction {k} must be [op, [slots], {{attrs}}]: {ins!r}")
        if f"cuvil.{ins[0]}" not in ELEMENTWISE:
            raise VerifyError(f"program instruction {k}: {ins[0]!r} is not an elementwise op")
        for s in ins[1]:
            if not (isinstance(s, int) and 0 <= s < n_inputs + k):
                raise VerifyError(f"program instruction {k}: slot {s!r} out of range")


def infer_program(program, input_types: list[TensorType]) -> TensorType:
    _check_program(program, len(input_types))
    slots = list(input_types)
    for op, srcs, attrs in program:
        slots.append(OP_REGISTRY[f"cuvil.{op}"].infer_types([slots[s] for s in srcs], attrs)[0])
    return slots[-1]


def eval_program(program, args: list[np.ndarray]) -> np.ndarray:
    slots = list(args)
    for op, srcs, attrs in program:
        slots.append(OP_REGISTRY[f"cuvil.{op}"].reference([slots[s] for s in srcs], attrs)[0])
    return slots[-1]


def program_inputs_used(program) -> set[int]:
    return {s for _, srcs, _ in program for s in srcs}


class Fused(Op):
    """A chain of elementwise ops computed in one loop; `program` as described above."""

    name = "cuvil.fused"

    @classmethod
    def infer_types(cls, types, attrs):
        out = infer_program(attrs["program"], types)
        shape = broadcast_shapes(*(t.shape for t in types))
        if out.shape != shape:
            raise VerifyError(f"cuvil.fused output shape {out.shape} is not the broadcast {shape}")
        return [out]

    @classmethod
    def reference(cls, args, attrs):
        out = eval_program(attrs["program"], args)
        shape = np.broadcast_shapes(*(a.shape for a in args))
        return [np.broadcast_to(out, shape).copy()]
