"""canonicalize: rewrite framework-shaped IR into the few forms later passes match.

- `cuvil.batch_norm(x, mean, var, w, b)` -> `add(mul(x, scale), shift)`; scale and shift
  are new [1, C, 1, ...] constants when the parameters are constants, else IR ops;
- no-op cast / reshape / broadcast_to (same type) and identity transposes disappear;
  reshape(reshape(x)) -> reshape(x); transpose(transpose(x)) -> one transpose;
- constants go to the right of commutative ops: add(c, x) -> add(x, c);
- float `sub(x, c)` -> `add(x, -c)`, `div(x, c)` -> `mul(x, 1/c)` (f16 only when 1/c is
  exact); then `add(x, 0)` and `mul(x, 1)` -> x where that keeps x's type;
- a strided 1x1 `conv2d` without padding -> the same conv at stride 1 on
  `slice(x, steps = the strides)`: the kernels then pack the kept pixels as a
  pointwise conv (plain copies) instead of gathering im2col panels from the whole input.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Module, Op
from ..ir.types import FLOAT_DTYPES
from .rewrite import ConstNames, add_constant, add_op, const_value, constant_name, erase_if_dead, replace_op

COMMUTATIVE = frozenset({"cuvil.add", "cuvil.mul", "cuvil.maximum", "cuvil.minimum", "cuvil.eq",
                         "cuvil.ne", "cuvil.and", "cuvil.or"})


def _forward(op: Op) -> bool:
    replace_op(op, [op.operands[0]])
    return True


def _same_type(op: Op) -> bool:
    x, r = op.operands[0].type, op.result.type
    return (x.shape, x.dtype) == (r.shape, r.dtype)


def _reshape(op: Op, names) -> bool:
    if _same_type(op):
        return _forward(op)
    inner = op.operands[0].defining_op
    if inner is not None and inner.name == "cuvil.reshape":
        op.set_operand(0, inner.operands[0])
        erase_if_dead(inner)
        return True
    return False


def _transpose(op: Op, names) -> bool:
    perm = list(op.attrs["perm"])
    if perm == sorted(perm):
        return _forward(op)
    inner = op.operands[0].defining_op
    if inner is not None and inner.name == "cuvil.transpose":
        op.attrs["perm"] = [inner.attrs["perm"][p] for p in perm]
        op.set_operand(0, inner.operands[0])
        erase_if_dead(inner)
        return True
    return False


def _noop_if_same(op: Op, names) -> bool:
    return _forward(op) if _same_type(op) else False


def _batch_norm(op: Op, names: ConstNames) -> bool:
    x, mean, var, w, b = op.operands
    block, loc, eps = op.parent, op.loc, op.attrs["eps"]
    shape = [1, x.shape[1]] + [1] * (x.type.rank - 2)
    params = [const_value(v) for v in (mean, var, w, b)]
    if all(p is not None for p in params):
        m, v, g, beta = (p.astype(np.float64) for p in params)
        scale = g / np.sqrt(v + eps)
        shift = beta - m * scale
        prefix = constant_name(w).rsplit(".", 1)[0] if "." in constant_name(w) else "bn"
        s = add_constant(block, op, scale.reshape(shape).astype(x.type.np_dtype), names.fresh(f"{prefix}.scale"), loc)
        t = add_constant(block, op, shift.reshape(shape).astype(x.type.np_dtype), names.fresh(f"{prefix}.shift"), loc)
    else:  # scale = w * rsqrt(var + eps); shift = b - mean * scale, as ops
        def emit(name, *args, **attrs):
            return add_op(block, op, name, args, attrs, loc).result
        e = add_constant(block, op, np.full(1, eps, var.type.np_dtype), names.numbered("bn.eps"), loc)
        scale = emit("cuvil.mul", w, emit("cuvil.rsqrt", emit("cuvil.add", var, e)))
        shift = emit("cuvil.sub", b, emit("cuvil.mul", mean, scale))
        s, t = emit("cuvil.reshape", scale, shape=shape), emit("cuvil.reshape", shift, shape=shape)
    y = add_op(block, op, "cuvil.mul", [x, s], loc=loc).result
    replace_op(op, [add_op(block, op, "cuvil.add", [y, t], loc=loc).result])
    return True


def _is_pow2(c: np.ndarray) -> bool:
    return bool(np.all(np.abs(np.frexp(c.astype(np.float64))[0]) == 0.5))


def _binary(op: Op, names: ConstNames) -> bool:
    x, y = op.operands
    cx, c = const_value(x), const_value(y)
    if op.name in COMMUTATIVE and cx is not None and c is None:
        op.operands = [y, x]
        return True
    if c is None or op.result.dtype not in FLOAT_DTYPES:
        return False
    block, loc = op.parent, op.loc
    if op.name == "cuvil.sub":
        neg = add_constant(block, op, -c, names.fresh(f"{constant_name(y)}.neg"), loc)
        replace_op(op, [add_op(block, op, "cuvil.add", [x, neg], loc=loc).result])
        return True
    if op.name == "cuvil.div":
        with np.errstate(all="ignore"):
            recip = (1.0 / c.astype(np.float64)).astype(c.dtype)
        if not np.all(np.isfinite(recip)) or np.any(c == 0) or (c.dtype == np.float16 and not _is_pow2(c)):
            return False
        r = add_constant(block, op, recip, names.fresh(f"{constant_name(y)}.recip"), loc)
        replace_op(op, [add_op(block, op, "cuvil.mul", [x, r], loc=loc).result])
        return True
    identity = {"cuvil.add": 0, "cuvil.mul": 1}.get(op.name)
    if identity is not None and np.all(c == identity) and x.type.shape == op.result.shape:
        return _forward(op)
    return False


def _strided_pointwise(op: Op, names) -> bool:
    """conv2d(x, W[oc, icg, 1, 1], stride (sh, sw) != 1, no padding) ->
    conv2d(slice(x, steps [1, 1, sh, sw]), W, stride 1)."""
    x, w = op.operands[0], op.operands[1]
    (sh, sw), oh, ow = op.attrs["stride"], op.result.shape[2], op.result.shape[3]
    if tuple(w.shape[2:]) != (1, 1) or (sh, sw) == (1, 1) or any(op.attrs["pads"]):
        return False
    if not all(isinstance(d, int) for d in (*x.shape[2:], oh, ow)):
        return False
    ends = [x.shape[0], x.shape[1], (oh - 1) * sh + 1, (ow - 1) * sw + 1]
    sliced = add_op(op.parent, op, "cuvil.slice", [x], dict(starts=[0, 0, 0, 0], ends=ends, steps=[1, 1, sh, sw]),
                    op.loc).result
    op.set_operand(0, sliced)
    op.attrs["stride"] = [1, 1]
    return True


_RULES = {
    "cuvil.conv2d": _strided_pointwise,
    "cuvil.batch_norm": _batch_norm,
    "cuvil.reshape": _reshape,
    "cuvil.transpose": _transpose,
    "cuvil.cast": _noop_if_same,
    "cuvil.broadcast_to": _noop_if_same,
    **{n: _binary for n in (*COMMUTATIVE, "cuvil.sub", "cuvil.div")},
}


@dataclass(frozen=True)
class Canonicalize:
    name = "canonicalize"
    max_sweeps: int = 8

    def apply(self, module: Module) -> None:
        names = ConstNames(module)
        for fn in module.all_functions():
            for _ in range(self.max_sweeps):
                changed = False
                for op in list(fn.body.ops):
                    rule = _RULES.get(op.name)
                    while rule is not None and op.parent is not None and rule(op, names):
                        changed = True
                if not changed:
                    break
