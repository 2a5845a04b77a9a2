"""Constants, the return terminator, and data-movement ops (reshape, transpose, broadcast,
concat, slice, pad, gather)."""
from __future__ import annotations

import numpy as np

from ...errors import VerifyError
from ..core import Op
from .. import symdim
from ..types import TensorType, broadcast_shapes


class Constant(Op):
    """A weight or folded constant. attrs: name (unique in the module). The array is
    `op.value`; the .cvir bundle stores it under that name."""

    name = "cuvil.constant"
    num_operands = 0

    def __init__(self, value: np.ndarray, name: str, loc: str = ""):
        self.value = np.ascontiguousarray(value).reshape(np.shape(value))  # keeps 0-d as 0-d
        super().__init__([], {"name": name}, [TensorType.of(self.value)], loc)

    @classmethod
    def infer_types(cls, types, attrs):
        raise VerifyError("cuvil.constant's type comes from its value")

    def verify(self):
        if self.operands:
            raise VerifyError("cuvil.constant takes no operands")
        if self.value is not None and TensorType.of(self.value) != self.result.type:
            raise VerifyError(f"constant {self.attrs['name']}: value does not match {self.result.type}")

    @classmethod
    def reference(cls, args, attrs):
        raise VerifyError("cuvil.constant is evaluated from its value")


class Return(Op):
    name = "cuvil.return"

    @classmethod
    def infer_types(cls, types, attrs):
        return []

    @classmethod
    def reference(cls, args, attrs):
        return []


class Reshape(Op):
    name = "cuvil.reshape"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        x, shape = types[0], tuple(attrs["shape"])
        try:
            want = symdim.product(shape)
        except Exception:
            raise VerifyError(f"cuvil.reshape: bad shape {list(shape)}") from None
        if want != x.numel_dim:
            raise VerifyError(f"cuvil.reshape: {x} has {x.numel_dim} elements, shape {list(shape)} has {want}")
        return [TensorType(shape, x.dtype)]

    # Attributes holding dims (symbolic ones are evaluated before `reference` runs).
    dim_attrs = ("shape",)

    @classmethod
    def reference(cls, args, attrs):
        return [args[0].reshape(attrs["shape"])]


class Transpose(Op):
    name = "cuvil.transpose"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        x, perm = types[0], attrs["perm"]
        if sorted(perm) != list(range(x.rank)):
            raise VerifyError(f"cuvil.transpose: perm {perm} is not a permutation of {x.rank} dims")
        return [TensorType(tuple(x.shape[p] for p in perm), x.dtype)]

    @classmethod
    def reference(cls, args, attrs):
        return [np.ascontiguousarray(np.transpose(args[0], attrs["perm"]))]


class BroadcastTo(Op):
    name = "cuvil.broadcast_to"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        x, shape = types[0], tuple(attrs["shape"])
        try:
            if broadcast_shapes(x.shape, shape) != shape:
                raise ValueError
        except ValueError:
            raise VerifyError(f"cuvil.broadcast_to: {x} does not broadcast to {list(shape)}") from None
        return [TensorType(shape, x.dtype)]

    dim_attrs = ("shape",)

    @classmethod
    def reference(cls, args, attrs):
        return [np.broadcast_to(args[0], attrs["shape"]).copy()]


class Concat(Op):
    name = "cuvil.concat"

    @classmethod
    def infer_types(cls, types, attrs):
        ax = attrs["axis"]
        if not types:
            raise VerifyError("cuvil.concat needs operands")
        first = types[0]
        if not 0 <= ax < first.rank:
            raise VerifyError(f"cuvil.concat: axis {ax} out of range for {first}")
        total = 0
        for t in types:
            if t.rank != first.rank or t.dtype != first.dtype or any(
                    a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != ax):
                raise VerifyError(f"cuvil.concat: {t} does not match {first} off axis {ax}")
            total = symdim.add(total, t.shape[ax])
        shape = list(first.shape)
        shape[ax] = total
        return [TensorType(tuple(shape), first.dtype)]

    @classmethod
    def reference(cls, args, attrs):
        return [np.concatenate(args, axis=attrs["axis"])]


class Slice(Op):
    """Per-dim starts/ends/steps (normalised: 0 <= start, ends clamped, steps >= 1)."""

    name = "cuvil.slice"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        x = types[0]
        st, en, sp = attrs["starts"], attrs["ends"], attrs["steps"]
        if not len(st) == len(en) == len(sp) == x.rank:
            raise VerifyError(f"cuvil.slice: starts/ends/steps must each have {x.rank} entries")
        shape = []
        for d, s, e, k in zip(x.shape, st, en, sp):
            if isinstance(s, int) and isinstance(e, int) and isinstance(d, int):
                if not (0 <= s <= e <= d and k >= 1):
                    raise VerifyError(f"cuvil.slice: bad range {s}:{e}:{k} for dim {d}")
                shape.append(max(0, -(-(e - s) // k)))
            elif k == 1 and isinstance(s, int) and s >= 0 and (e == d or isinstance(d, int) or isinstance(e, int)):
                # A symbolic end or dim: [s, e) of the dim (the backend checks e <= d within the bounds).
                if isinstance(e, int) and e < s:
                    raise VerifyError(f"cuvil.slice: bad range {s}:{e}:{k} for dim {d}")
                shape.append(symdim.sub(e, s))
            else:
                raise VerifyError(f"cuvil.slice: range {s}:{e}:{k} of dim {d} is not supported "
                                  "with symbolic dims (steps of 1 and a constant start only)")
        return [TensorType(tuple(shape), x.dtype)]

    dim_attrs = ("starts", "ends")

    @classmethod
    def reference(cls, args, attrs):
        idx = tuple(slice(s, e, k) for s, e, k in zip(attrs["starts"], attrs["ends"], attrs["steps"]))
        return [np.ascontiguousarray(args[0][idx])]


class Pad(Op):
    """Constant padding: pads is [[lo, hi], ...] per dim (non-negative), value a float."""

    name = "cuvil.pad"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        x, pads = types[0], attrs["pads"]
        if len(pads) != x.rank or any(lo < 0 or hi < 0 for lo, hi in pads):
            raise VerifyError(f"cuvil.pad: pads {pads} must be {x.rank} non-negative [lo, hi] pairs")
        return [TensorType(tuple(symdim.add(d, lo + hi) for d, (lo, hi) in zip(x.shape, pads)), x.dtype)]

    @classmethod
    def reference(cls, args, attrs):
        return [np.pad(args[0], [tuple(p) for p in attrs["pads"]], constant_values=attrs["value"])]


class Gather(Op):
    """np.take(x, indices, axis): embedding lookup, index_select, select by tensor."""

    name = "cuvil.gather"
    num_operands = 2

    @classmethod
    def infer_types(cls, types, attrs):
        x, idx = types
        ax = attrs["axis"]
        if idx.dtype not in ("i64", "i32") or not 0 <= ax < x.rank:
            raise VerifyError(f"cuvil.gather: needs integer indices and an axis in range, got {idx}, axis {ax}")
        return [TensorType((*x.shape[:ax], *idx.shape, *x.shape[ax + 1:]), x.dtype)]

    @classmethod
    def reference(cls, args, attrs):
        x, idx = args
        n = x.shape[attrs["axis"]]
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"cuvil.gather: index out of range [{-n}, {n})")
        return [np.take(x, np.where(idx < 0, idx + n, idx), axis=attrs["axis"])]


class DimValue(Op):
    """The value of a dim as a 0-d i64 tensor: attrs `dims` = [an int or symbolic dim text].
    Lets a symbolic size take part in arithmetic (a flat index's stride, a mean's count)."""

    name = "cuvil.dim"
    num_operands = 0
    dim_attrs = ("dims",)

    @classmethod
    def infer_types(cls, types, attrs):
        dims = attrs.get("dims")
        if not isinstance(dims, list) or len(dims) != 1:
            raise VerifyError(f"cuvil.dim needs dims = [one dim], got {dims!r}")
        return [TensorType((), "i64")]

    @classmethod
    def reference(cls, args, attrs):
        return [np.int64(attrs["dims"][0])]

