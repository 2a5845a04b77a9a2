"""Reductions over a sorted list of axes, with or without kept dims; arg-reductions and
running sums / products (scans) along one axis."""
from __future__ import annotations

import numpy as np

from ...errors import VerifyError
from ..core import Op
from ..types import TensorType


def reduced_shape(shape, axes, keepdims: bool) -> tuple:
    """`shape` with `axes` kept as 1 or dropped."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


class Reduce(Op):
    num_operands = 1
    np_fn = None

    @classmethod
    def infer_types(cls, types, attrs):
        x = types[0]
        axes = attrs["axes"]
        if list(axes) != sorted(set(axes)) or any(not 0 <= a < x.rank for a in axes):
            raise VerifyError(f"{cls.name}: axes {axes} must be sorted, unique and in range for {x}")
        return [TensorType(reduced_shape(x.shape, axes, attrs["keepdims"]), x.dtype)]

    @classmethod
    def reference(cls, args, attrs):
        x = args[0]
        src = x.astype(np.float64) if x.dtype.kind == "f" else x
        out = cls.np_fn(src, axis=tuple(attrs["axes"]), keepdims=attrs["keepdims"])
        return [np.asarray(out).astype(x.dtype)]


class ReduceSum(Reduce):
    name = "cuvil.reduce_sum"
    np_fn = staticmethod(np.sum)


class ReduceMean(Reduce):
    name = "cuvil.reduce_mean"
    np_fn = staticmethod(np.mean)


class ReduceMax(Reduce):
    name = "cuvil.reduce_max"
    np_fn = staticmethod(np.max)


class ReduceMin(Reduce):
    name = "cuvil.reduce_min"
    np_fn = staticmethod(np.min)


class ReduceProd(Reduce):
    name = "cuvil.reduce_prod"
    np_fn = staticmethod(np.prod)


class Scan(Op):
    """The running sum / product along one axis, first element first: x's type."""
    num_operands = 1
    np_fn = None

    @classmethod
    def infer_types(cls, types, attrs):
        x = types[0]
        if not 0 <= attrs["axis"] < max(x.rank, 1):
            raise VerifyError(f"{cls.name}: axis {attrs['axis']} out of range for {x}")
        return [x]

    @classmethod
    def reference(cls, args, attrs):
        x = args[0]
        if x.ndim == 0:
            return [x.copy()]
        src = x.astype(np.float64) if x.dtype.kind == "f" else x
        return [cls.np_fn(src, axis=attrs["axis"]).astype(x.dtype)]


class CumSum(Scan):
    name = "cuvil.cumsum"
    np_fn = staticmethod(np.cumsum)


class CumProd(Scan):
    name = "cuvil.cumprod"
    np_fn = staticmethod(np.cumprod)


class ArgReduce(Op):
    """The index (i64) of the first largest / smallest element along one axis; NaN counts
    as larger and smaller than every number (the first NaN wins), as in torch and NumPy."""
    num_operands = 1
    np_fn = None

    @classmethod
    def infer_types(cls, types, attrs):
        x = types[0]
        axis = attrs["axis"]
        if not 0 <= axis < max(x.rank, 1):
            raise VerifyError(f"{cls.name}: axis {axis} out of range for {x}")
        if x.rank and x.shape[axis] == 0:
            raise VerifyError(f"{cls.name}: the axis of {x} is empty")
        return [TensorType(reduced_shape(x.shape, [axis], attrs["keepdims"]), "i64")]

    @classmethod
    def reference(cls, args, attrs):
        x = args[0]
        if x.ndim == 0:
            return [np.asarray(0, np.int64)]
        out = cls.np_fn(x.astype(np.float64) if x.dtype == np.float16 else x, axis=attrs["axis"],
                        keepdims=attrs["keepdims"])
        return [np.asarray(out, np.int64)]


class ArgMax(ArgReduce):
    name = "cuvil.argmax"
    np_fn = staticmethod(np.argmax)


class ArgMin(ArgReduce):
    name = "cuvil.argmin"
    np_fn = staticmethod(np.argmin)
