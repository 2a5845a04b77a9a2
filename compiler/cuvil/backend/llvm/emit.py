"""Shared code-generation helpers: LLVM types of Cuvil dtypes, loads/stores, scalar
evaluation of elementwise programs, and loop nests over strided tensors.

Convention: every tensor is contiguous row-major in memory; a *view* of it for a loop
nest is (pointer, element offset, per-dim element strides), with stride 0 on broadcast
dims. Computation on f16 happens in f32; bool is i8 in memory and i1 in registers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from llvmlite import ir

from ...errors import BackendError
from ...ir.types import FLOAT_DTYPES
from .loops import for_range
from .mathlib import get_math
from .symbolic import Size

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
PTR = I8.as_pointer()
MEM_TYPES = {"f32": F32, "f16": F16, "f64": F64, "i64": I64, "i32": I32, "i8": I8, "u8": I8, "bool": I8}
REG_TYPES = {"f32": F32, "f16": F32, "f64": F64, "i64": I64, "i32": I32, "i8": I8, "u8": I8, "bool": I1}
# Flags on float arithmetic: allow FMA contraction only (results stay IEEE otherwise).
FAST = ("contract",)
# Reductions may be reassociated so that they vectorise.
REDUCE = ("contract", "reassoc", "nsz")


def i64(v) -> ir.Value:
    """An i64 of an int, or of a runtime size (symbolic.Size) in the current function."""
    if isinstance(v, Size):
        return v.value()
    return ir.Constant(I64, int(v))


def fsize(b: ir.IRBuilder, dtype: str, v) -> ir.Value:
    """A count (an int or a runtime size) as a float of `dtype`."""
    if isinstance(v, Size):
        return b.sitofp(v.value(), REG_TYPES[dtype])
    return fconst(dtype, v)


def fconst(dtype: str, v: float) -> ir.Constant:
    return ir.Constant(REG_TYPES[dtype], float(v))


def const_like(x: ir.Value, dtype: str, v: float) -> ir.Constant:
    """fconst(dtype, v), splat to x's vector width when x is a vector."""
    if isinstance(x.type, ir.VectorType):
        return ir.Constant(x.type, [float(v)] * x.type.count)
    return fconst(dtype, v)


def load(b: ir.IRBuilder, ptr: ir.Value, index: ir.Value, dtype: str) -> ir.Value:
    v = b.load(b.gep(ptr, [index], inbounds=True))
    if dtype == "f16":
        return b.fpext(v, F32)
    if dtype == "bool":
        return b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
    return v


def store(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, index: ir.Value, dtype: str) -> None:
    if dtype == "f16":
        value = b.fptrunc(value, F16)
    elif dtype == "bool":
        value = b.zext(value, I8)
    b.store(value, b.gep(ptr, [index], inbounds=True))


def emit_memcpy(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, nbytes: int) -> None:
    """Copy nbytes (a compile-time count) from src to dst (any pointers, not overlapping)."""
    fn = b.module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    b.call(fn, [b.bitcast(dst, PTR), b.bitcast(src, PTR), i64(nbytes), ir.Constant(ir.IntType(1), 0)])


def intrinsic(b: ir.IRBuilder, name: str, args: Sequence[ir.Value]) -> ir.Value:
    """Call a type-overloaded LLVM intrinsic whose operands and result share one type."""
    ty = args[0].type
    et = ty.element if isinstance(ty, ir.VectorType) else ty
    suffix = et.intrinsic_name if hasattr(et, "intrinsic_name") else f"i{et.width}"
    if isinstance(ty, ir.VectorType):
        suffix = f"v{ty.count}{suffix}"
    full = f"{name}.{suffix}"
    fn = b.module.globals.get(full)
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ty, [ty] * len(args)), name=full)
    return b.call(fn, list(args))


# -- scalar ops --------------------------------------------------------------------------
def _clamp(b, x, dtype, attrs):
    if dtype in FLOAT_DTYPES:
        if attrs.get("min") is not None:
            x = intrinsic(b, "llvm.maxnum", [x, const_like(x, dtype, attrs["min"])])
        if attrs.get("max") is not None:
            x = intrinsic(b, "llvm.minnum", [x, const_like(x, dtype, attrs["max"])])
        return x
    ty = REG_TYPES[dtype]
    if attrs.get("min") is not None:
        lo = ir.Constant(ty, int(attrs["min"]))
        x = b.select(b.icmp_signed("<", x, lo), lo, x)
    if attrs.get("max") is not None:
        hi = ir.Constant(ty, int(attrs["max"]))
        x = b.select(b.icmp_signed(">", x, hi), hi, x)
    return x


def _math(name):
    """The float32 math library; f64 values go through it in f32 (documented limit)."""
    def emit(b, x, dtype, attrs):
        if x.type == F64:
            return b.fpext(b.call(get_math(b.module, name), [b.fptrunc(x, F32)]), F64)
        return b.call(get_math(b.module, name), [x])
    return emit


def _call_math(b, name, x):
    return _math(name)(b, x, None, None)


def _fmul(b, x, y):
    return b.fmul(x, y, flags=FAST)


def _fadd(b, x, y):
    return b.fadd(x, y, flags=FAST)


def _gelu(b, x, dtype, attrs):
    half = fconst(dtype, 0.5)
    one = fconst(dtype, 1.0)
    if attrs.get("approximate") == "tanh":
        c = fconst(dtype, math.sqrt(2.0 / math.pi))
        inner = _fmul(b, c, _fadd(b, x, _fmul(b, fconst(dtype, 0.044715), _fmul(b, x, _fmul(b, x, x)))))
        t = _call_math(b, "tanh", inner)
    else:
        t = _call_math(b, "erf", _fmul(b, x, fconst(dtype, 1.0 / math.sqrt(2.0))))
    return _fmul(b, _fmul(b, half, x), _fadd(b, one, t))


def _hardsigmoid(b, x, dtype, attrs):
    y = _clamp(b, _fadd(b, x, const_like(x, dtype, 3.0)), dtype, {"min": 0.0, "max": 6.0})
    return b.fdiv(y, const_like(x, dtype, 6.0))


def _positive_select(b, x, dtype, neg_value):
    return b.select(b.fcmp_ordered(">", x, const_like(x, dtype, 0.0)), x, neg_value)


def round_bf16(b, x):
    """f32 (scalar or vector) rounded to the nearest bfloat16, ties to even, as f32
    (ir/ops/quant.bf16_round): integer ops on the bits; NaN stays NaN."""
    vec = isinstance(x.type, ir.VectorType)
    n = x.type.count if vec else 1
    ity = ir.VectorType(ir.IntType(32), n) if vec else ir.IntType(32)

    def c(v):
        return ir.Constant(ity, [v] * n) if vec else ir.Constant(ity, v)
    bits = b.bitcast(x, ity)
    lsb = b.and_(b.lshr(bits, c(16)), c(1))
    r = b.bitcast(b.and_(b.add(bits, b.add(lsb, c(0x7FFF))), c(-65536)), x.type)
    return b.select(b.fcmp_unordered("uno", x, x), x, r)


def _fake_quant(b, x, dtype, attrs):
    """quant.fake_quant exactly: no fast-math, the same f32 roundings (bf16: round_bf16,
    on a vector too)."""
    from ...ir.ops.quant import act_bounds
    if attrs["dtype"] == "bf16":
        return round_bf16(b, x)
    lo, hi = act_bounds(attrs)
    zp = fconst(dtype, attrs["zero_point"])
    q = b.fadd(intrinsic(b, "llvm.rint", [b.fmul(x, fconst(dtype, float(np.float32(1.0 / attrs["scale"]))))]), zp)
    q = intrinsic(b, "llvm.minnum", [intrinsic(b, "llvm.maxnum", [q, fconst(dtype, lo)]), fconst(dtype, hi)])
    return b.fmul(b.fsub(q, zp), fconst(dtype, float(np.float32(attrs["scale"]))))


_FLOAT_UNARY = {
    "neg": lambda b, x, d, a: b.fneg(x),
    "abs": lambda b, x, d, a: intrinsic(b, "llvm.fabs", [x]),
    "relu": lambda b, x, d, a: b.select(b.fcmp_ordered(">", x, const_like(x, d, 0.0)), x, const_like(x, d, 0.0)),
    "sigmoid": _math("sigmoid"),
    "tanh": _math("tanh"),
    "exp": _math("exp"),
    "log": _math("log"),
    "erf": _math("erf"),
    "sin": _math("sin"),
    "cos": _math("cos"),
    "gelu": _gelu,
    "silu": lambda b, x, d, a: _fmul(b, x, _call_math(b, "sigmoid", x)),
    "hardsigmoid": _hardsigmoid,
    "hardswish": lambda b, x, d, a: _fmul(b, x, _hardsigmoid(b, x, d, a)),
    "clamp": _clamp,
    "sqrt": lambda b, x, d, a: intrinsic(b, "llvm.sqrt", [x]),
    "rsqrt": lambda b, x, d, a: b.fdiv(fconst(d, 1.0), intrinsic(b, "llvm.sqrt", [x])),
    "reciprocal": lambda b, x, d, a: b.fdiv(fconst(d, 1.0), x),
    "elu": lambda b, x, d, a: _positive_select(
        b, x, d, _fmul(b, fconst(d, a.get("alpha", 1.0)),
                       b.fsub(_call_math(b, "exp", x), fconst(d, 1.0)))),
    "leaky_relu": lambda b, x, d, a: _positive_select(b, x, d, _fmul(b, x, const_like(x, d, a.get("slope", 0.01)))),
    "fake_quant": _fake_quant,
}


def _fpow(b, x, y, dtype):
    if isinstance(y, ir.Constant):
        e = float(y.constant)
        if e == 2.0:
            return b.fmul(x, x)
        if e == 1.0:
            return x
        if e == 0.5:
            return intrinsic(b, "llvm.sqrt", [x])
        if e == 3.0:
            return b.fmul(b.fmul(x, x), x)
    return intrinsic(b, "llvm.pow", [x, y])


_FLOAT_BINARY = {
    "add": lambda b, x, y, d: b.fadd(x, y, flags=FAST),
    "sub": lambda b, x, y, d: b.fsub(x, y, flags=FAST),
    "mul": lambda b, x, y, d: b.fmul(x, y, flags=FAST),
    "div": lambda b, x, y, d: b.fdiv(x, y),
    "pow": _fpow,
    "maximum": lambda b, x, y, d: intrinsic(b, "llvm.maximum", [x, y]),
    "minimum": lambda b, x, y, d: intrinsic(b, "llvm.minimum", [x, y]),
}
_INT_BINARY = {
    "add": lambda b, x, y: b.add(x, y),
    "sub": lambda b, x, y: b.sub(x, y),
    "mul": lambda b, x, y: b.mul(x, y),
    "maximum": lambda b, x, y: b.select(b.icmp_signed(">", x, y), x, y),
    "minimum": lambda b, x, y: b.select(b.icmp_signed("<", x, y), x, y),
}
# Float ops whose emitters above also take vectors (no math-library calls): a GEMM tile's
# epilogue runs vectorised when its program uses only these.
VECTOR_FLOAT_OPS = frozenset({"neg", "abs", "relu", "clamp", "hardsigmoid", "hardswish", "leaky_relu",
                              "add", "sub", "mul", "div", "maximum", "minimum"})


def vector_step(op: str, attrs: dict) -> bool:
    """Whether a program step runs on f32 vectors (VECTOR_FLOAT_OPS, and the rounding to
    bfloat16 of `precision: bf16`: fake_quant {dtype: bf16})."""
    return op in VECTOR_FLOAT_OPS or (op == "fake_quant" and attrs.get("dtype") == "bf16")


_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _int_floordiv(b, x, y):
    q = b.sdiv(x, y)
    r = b.srem(x, y)
    zero = ir.Constant(x.type, 0)
    fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("!=", b.icmp_signed("<", r, zero),
                                                            b.icmp_signed("<", y, zero)))
    return b.sub(q, b.zext(fix, x.type))


def emit_cast(b: ir.IRBuilder, x: ir.Value, src: str, dst: str) -> ir.Value:
    if src == dst:
        return x
    to = REG_TYPES[dst]
    sf, df = src in FLOAT_DTYPES, dst in FLOAT_DTYPES
    if dst == "bool":
        return b.fcmp_unordered("!=", x, fconst(src, 0.0)) if sf else b.icmp_unsigned("!=", x, ir.Constant(x.type, 0))
    if src == "bool":
        return b.uitofp(x, to) if df else b.zext(x, to)
    if sf and df:
        if x.type == to:
            return x
        return b.fpext(x, to) if to.intrinsic_name == "f64" else b.fptrunc(x, to)
    if sf:
        return b.fptoui(x, to) if dst == "u8" else b.fptosi(x, to)
    if df:
        return b.uitofp(x, to) if src == "u8" else b.sitofp(x, to)
    if to.width == x.type.width:
        return x
    if to.width < x.type.width:
        return b.trunc(x, to)
    return b.zext(x, to) if src == "u8" else b.sext(x, to)


def emit_scalar_op(b: ir.IRBuilder, op: str, args: list[ir.Value], dtypes: list[str], attrs: dict):
    """One elementwise op on scalars; returns (value, dtype)."""
    d = dtypes[0]
    if op == "cast":
        return emit_cast(b, args[0], d, attrs["dtype"]), attrs["dtype"]
    if op == "where":
        return b.select(args[0], args[1], args[2]), dtypes[1]
    if op in _CMP:
        if d in FLOAT_DTYPES:
            fn = b.fcmp_unordered if op == "ne" else b.fcmp_ordered
            return fn(_CMP[op], args[0], args[1]), "bool"
        cmp = b.icmp_unsigned if d in ("u8", "bool") else b.icmp_signed
        return cmp(_CMP[op], args[0], args[1]), "bool"
    if op in ("and", "or"):
        return (b.and_ if op == "and" else b.or_)(args[0], args[1]), d
    if d in FLOAT_DTYPES:
        if op in _FLOAT_UNARY:
            return _FLOAT_UNARY[op](b, args[0], d, attrs), d
        if op in _FLOAT_BINARY:
            return _FLOAT_BINARY[op](b, args[0], args[1], d), d
    else:
        if op == "neg":
            return b.neg(args[0]), d
        if op == "abs":
            x = args[0]
            return b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)), b.neg(x), x), d
        if op == "clamp":
            return _clamp(b, args[0], d, attrs), d
        if op == "relu":
            x = args[0]
            return b.select(b.icmp_signed(">", x, ir.Constant(x.type, 0)), x, ir.Constant(x.type, 0)), d
        if op in _INT_BINARY:
            return _INT_BINARY[op](b, args[0], args[1]), d
        if op == "div":
            return _int_floordiv(b, args[0], args[1]), d
    raise BackendError(f"no code generation for cuvil.{op} on {d}")


def emit_program(b: ir.IRBuilder, program, values: list[ir.Value], dtypes: list[str]):
    """Evaluate an elementwise program on scalars; returns (value, dtype) of its result."""
    values, dtypes = list(values), list(dtypes)
    for op, srcs, attrs in program:
        v, d = emit_scalar_op(b, op, [values[s] for s in srcs], [dtypes[s] for s in srcs], attrs)
        values.append(v)
        dtypes.append(d)
    return values[-1], dtypes[-1]


# -- strided loop nests --------------------------------------------------------------------
def contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Element strides of a contiguous tensor of `shape` viewed as broadcast to `out_shape`."""
    pad = len(out_shape) - len(shape)
    full = [1] * pad + list(shape)
    strides = contiguous_strides(full)
    return [0 if full[i] == 1 and out_shape[i] != 1 else strides[i] for i in range(len(out_shape))]


@dataclass
class View:
    ptr: ir.Value       # typed pointer
    dtype: str
    strides: list[int]  # per loop dim, in elements
    offset: "int | ir.Value" = 0


def coalesce(shape: list[int], stride_sets: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent dims that every view walks uniformly; drop size-1 dims."""
    dims = [i for i, d in enumerate(shape) if d != 1]
    if not dims:
        return [1], [[0] for _ in stride_sets]
    new_shape = [shape[dims[0]]]
    new_strides = [[s[dims[0]]] for s in stride_sets]
    for i in dims[1:]:
        if all(ns[-1] == s[i] * shape[i] for ns, s in zip(new_strides, stride_sets)):
            new_shape[-1] *= shape[i]
            for ns, s in zip(new_strides, stride_sets):
                ns[-1] = s[i]
        else:
            new_shape.append(shape[i])
            for ns, s in zip(new_strides, stride_sets):
                ns.append(s[i])
    return new_shape, new_strides


def loop_nest(b: ir.IRBuilder, shape: Sequence[int], views: Sequence[View], body) -> None:
    """Loop over `shape` (row-major); call body(b, indices) with one flat element index
    per view. Dims are coalesced first so the innermost loop is as long as possible."""
    shape, strides = coalesce(list(shape), [v.strides for v in views])

    def rec(depth: int, bases: list[ir.Value]):
        if depth == len(shape):
            body(b, bases)
            return
        with for_range(b, shape[depth], name=f"d{depth}") as i:
            nxt = [base if st[depth] == 0 else b.add(base, b.mul(i, i64(st[depth])), flags=["nsw"])
                   for base, st in zip(bases, strides)]
            rec(depth + 1, nxt)

    rec(0, [v.offset if isinstance(v.offset, ir.Value) else i64(v.offset) for v in views])
