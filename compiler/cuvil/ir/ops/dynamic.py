"""Ops whose result size depends on the data: nonzero (with gather: masked_select and
boolean-mask indexing) and unique (with its inverse and counts).

Such a result has a symbolic dim of its own, named by the op's `size` attribute (a
*produced* symbol: no input binds it). Its bounds are [0, the largest possible count]
in the function's `dim_bounds`; memory is planned at the upper bound, and the op's
kernel stores the count it found into the run's symbol values, so every later kernel,
the output shapes the runtime reports and `cuvil.compile`'s arrays use the actual size.
The interpreter binds the symbol from the reference's result.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import VerifyError
from ..core import Op
from ..types import TensorType


def produced_symbols(op: Op) -> list[str]:
    """The symbols op's results introduce (empty for every other op)."""
    return [op.attrs["size"]] if isinstance(op, DataDependent) else []


def count_bound(t: TensorType, bounds: dict) -> int:
    """The number of elements of t at the symbols' upper bounds."""
    return math.prod(t.bound(bounds).shape) if t.rank else 1


class DataDependent(Op):
    """An op whose first result's leading dim is the produced symbol attrs["size"]."""

    @classmethod
    def check_size(cls, attrs) -> str:
        size = attrs.get("size")
        if not isinstance(size, str) or not size.isidentifier():
            raise VerifyError(f"{cls.name}: `size` must name the result's produced dim, got {size!r}")
        return size


class NonZero(DataDependent):
    """The indices of x's nonzero (true) elements, one row per element in row-major
    order: [size, rank] i64 (as torch.nonzero; ONNX's NonZero is its transpose)."""

    name = "cuvil.nonzero"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        return [TensorType((cls.check_size(attrs), types[0].rank), "i64")]

    @classmethod
    def reference(cls, args, attrs):
        x = args[0]
        if x.ndim == 0:
            return [np.zeros((1 if x else 0, 0), np.int64)]
        return [np.argwhere(x).astype(np.int64)]


class Unique(DataDependent):
    """The distinct values of x (flattened), ascending: [size] of x's dtype."""

    name = "cuvil.unique"
    num_operands = 1

    @classmethod
    def infer_types(cls, types, attrs):
        return [TensorType((cls.check_size(attrs),), types[0].dtype)]

    @classmethod
    def reference(cls, args, attrs):
        return [np.unique(np.asarray(args[0]).reshape(-1))]


class _UniqueOf(Op):
    """An op on x and its sorted distinct values (cuvil.unique's result)."""
    num_operands = 2

    @classmethod
    def check(cls, types):
        x, values = types
        if values.rank != 1 or values.dtype != x.dtype:
            raise VerifyError(f"{cls.name}: the values must be x's distinct values, got {values} for {x}")

    @staticmethod
    def positions(x, values) -> np.ndarray:
        return np.searchsorted(values, np.asarray(x).reshape(-1)).astype(np.int64)


class UniqueInverse(_UniqueOf):
    """Each element's index in the distinct values: x's shape, i64."""

    name = "cuvil.unique_inverse"

    @classmethod
    def infer_types(cls, types, attrs):
        cls.check(types)
        return [TensorType(types[0].shape, "i64")]

    @classmethod
    def reference(cls, args, attrs):
        x, values = args
        return [cls.positions(x, values).reshape(np.shape(x))]


class UniqueCounts(_UniqueOf):
    """How often each distinct value occurs: [size] i64."""

    name = "cuvil.unique_counts"

    @classmethod
    def infer_types(cls, types, attrs):
        cls.check(types)
        return [TensorType(types[1].shape, "i64")]

    @classmethod
    def reference(cls, args, attrs):
        x, values = args
        return [np.bincount(cls.positions(x, values), minlength=len(values)).astype(np.int64)]
