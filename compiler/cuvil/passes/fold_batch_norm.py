"""fold-batch-norm: fold per-output-channel affine constants (canonicalised batch norms)
into conv2d / matmul weights, leaving one bias add per layer.

    mul(conv2d(x, W), s)          -> conv2d(x, W * s[:, None, None, None])   s: [1, OC, 1, 1], [OC, 1, 1], ...
    mul(matmul(x, B), s)          -> matmul(x, B * s)                        B constant, s: [..., 1, N]
    mul(add(anchor, b), s)        -> add(mul(anchor, s), b * s)              (then the rule above)
    add(add(x, c1), c2)           -> add(x, c1 + c2)                         and the same for mul

The conv / matmul (and an inner add or mul) must have no other user, and a merged
constant must be no larger than the larger of its two parts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Module, Op, Value
from ..ir.ops import ANCHORS
from .rewrite import (ConstNames, add_constant, add_op, const_value, constant_name, erase_if_dead,
                      replace_op, single_user)

# Anchor -> (channel axis of its result, the weight's output-channel axis).
_AXES = {"cuvil.conv2d": (1, 0), "cuvil.matmul": (-1, -1)}


def _split_const(op: Op) -> tuple[Value, Value, np.ndarray] | None:
    """(value, constant value, its array) for a binary op with exactly one constant operand."""
    a, b = op.operands
    if const_value(b) is not None and const_value(a) is None:
        return a, b, const_value(b)
    if const_value(a) is not None and const_value(b) is None:
        return b, a, const_value(a)
    return None


def _foldable_anchor(v: Value, user: Op) -> Op | None:
    op = v.defining_op
    if op is None or op.name not in ANCHORS or len(op.operands) != 2 or op.attrs.get("post"):
        return None
    if single_user(v) is not user or const_value(op.operands[1]) is None:
        return None
    return op


def _per_channel(s: np.ndarray, shape: tuple, axis: int) -> np.ndarray | None:
    """s as a vector over `shape[axis]` if s broadcasts only along that axis, else None."""
    if s.ndim > len(shape):
        return None
    padded = (1,) * (len(shape) - s.ndim) + s.shape
    axis %= len(shape)
    if any(d != 1 for i, d in enumerate(padded) if i != axis) or padded[axis] not in (1, shape[axis]):
        return None
    return np.broadcast_to(s.reshape(-1).astype(np.float64), (shape[axis],))


def _fold_scale(mul: Op, names: ConstNames) -> bool:
    """mul(anchor, s) -> anchor with scaled weights."""
    split = _split_const(mul)
    if split is None:
        return False
    v, _, s = split
    anchor = _foldable_anchor(v, mul)
    if anchor is None or mul.result.shape != v.shape:
        return False
    out_axis, w_axis = _AXES[anchor.name]
    vec = _per_channel(s, v.shape, out_axis)
    if vec is None:
        return False
    x, w = anchor.operands
    wv = const_value(w).astype(np.float64)
    shape = [1] * wv.ndim
    shape[w_axis] = -1
    base = constant_name(w).removesuffix(".folded")
    w2 = add_constant(mul.parent, anchor, (wv * vec.reshape(shape)).astype(w.type.np_dtype),
                      names.fresh(f"{base}.folded"), anchor.loc)
    new = add_op(mul.parent, anchor, anchor.name, [x, w2], dict(anchor.attrs), anchor.loc)
    replace_op(mul, [new.result])
    erase_if_dead(anchor)
    return True


def _push_scale_through_bias(mul: Op, names: ConstNames) -> bool:
    """mul(add(anchor, b), s) -> add(mul(anchor, s), b * s)."""
    split = _split_const(mul)
    if split is None:
        return False
    a, s_val, s = split
    add = a.defining_op
    if add is None or add.name != "cuvil.add" or single_user(a) is not mul:
        return False
    inner = _split_const(add)
    if inner is None:
        return False
    v, b_val, b = inner
    anchor = _foldable_anchor(v, add)
    if anchor is None or not (v.shape == a.shape == mul.result.shape):
        return False
    if _per_channel(s, v.shape, _AXES[anchor.name][0]) is None:
        return False
    bs = (b.astype(np.float64) * s.astype(np.float64)).astype(b.dtype)
    block, loc = mul.parent, mul.loc
    scaled = add_op(block, mul, "cuvil.mul", [v, s_val], loc=loc).result
    bias = add_constant(block, mul, bs, names.fresh(f"{constant_name(b_val)}.scaled"), loc)
    replace_op(mul, [add_op(block, mul, "cuvil.add", [scaled, bias], loc=add.loc).result])
    erase_if_dead(add)
    return True


def _merge_constants(op: Op, names: ConstNames) -> bool:
    """add(add(x, c1), c2) -> add(x, c1 + c2); mul likewise."""
    split = _split_const(op)
    if split is None:
        return False
    a, _, c2 = split
    inner = a.defining_op
    if inner is None or inner.name != op.name or single_user(a) is not op:
        return False
    split = _split_const(inner)
    if split is None:
        return False
    x, c1_val, c1 = split
    fn = np.add if op.name == "cuvil.add" else np.multiply
    wide = np.float64 if c1.dtype.kind == "f" else c1.dtype
    merged = fn(c1.astype(wide), c2.astype(wide)).astype(c1.dtype)
    if merged.size > max(c1.size, c2.size):
        return False
    c = add_constant(op.parent, op, merged, names.fresh(f"{constant_name(c1_val)}.merged"), op.loc)
    replace_op(op, [add_op(op.parent, op, op.name, [x, c], loc=op.loc).result])
    erase_if_dead(inner)
    return True


_RULES = {"cuvil.mul": (_fold_scale, _push_scale_through_bias, _merge_constants),
          "cuvil.add": (_merge_constants,)}


@dataclass(frozen=True)
class FoldBatchNorm:
    name = "fold-batch-norm"
    max_sweeps: int = 8

    def apply(self, module: Module) -> None:
        names = ConstNames(module)
        for fn in module.all_functions():
            for _ in range(self.max_sweeps):
                changed = False
                for op in list(fn.body.ops):
                    for rule in _RULES.get(op.name, ()):
                        if op.parent is not None and rule(op, names):
                            changed = True
                            break
                if not changed:
                    break
