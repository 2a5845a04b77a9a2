"""Tensor types: a shape of ints and named symbolic dims, a dtype and a layout."""
from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod

import numpy as np

from ..errors import ParseError
from . import symdim

# Cuvil dtype name -> NumPy dtype.
DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "f64": np.dtype(np.float64),
    "i64": np.dtype(np.int64),
    "i32": np.dtype(np.int32),
    "i8": np.dtype(np.int8),
    "u8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}
FLOAT_DTYPES = frozenset({"f32", "f16", "f64"})

# A dim is an int or the canonical text of a polynomial in named symbols (symdim.py).
Dim = int | str


def dtype_of(array: np.ndarray) -> str:
    """The Cuvil dtype name of a NumPy array."""
    for name, dt in DTYPES.items():
        if array.dtype == dt:
            return name
    raise TypeError(f"unsupported array dtype {array.dtype}")


@dataclass(frozen=True)
class TensorType:
    """The type of a tensor value. `layout` is "" for row-major (the frontends' own layout)."""

    shape: tuple[Dim, ...]
    dtype: str = "f32"
    layout: str = ""

    def __post_init__(self):
        dims = []
        for d in self.shape:
            if isinstance(d, str):
                try:
                    d = symdim.canonical(d)
                except ParseError:
                    raise ValueError(f"bad symbolic dim {d!r}") from None
            else:
                d = int(d)
            if isinstance(d, int) and d < 0:
                raise ValueError(f"negative dim {d}")
            dims.append(d)
        object.__setattr__(self, "shape", tuple(dims))
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> int:
        if not self.is_static:
            raise ValueError(f"{self} has symbolic dims")
        return prod(self.shape)

    @property
    def numel_dim(self) -> "Dim":
        """The element count as a dim (symbolic when the shape is)."""
        return symdim.product(self.shape)

    @property
    def symbols(self) -> set[str]:
        return set().union(*(symdim.symbols(d) for d in self.shape)) if self.shape else set()

    def bound(self, bounds) -> "TensorType":
        """This type at the symbols' upper bounds (what memory is planned for)."""
        if self.is_static:
            return self
        return self.with_shape(symdim.upper_bound(d, bounds) for d in self.shape)

    def at(self, env) -> "TensorType":
        """This type with every symbol bound to its value in `env`."""
        return self if self.is_static else self.with_shape(symdim.substitute(self.shape, env))

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    def with_shape(self, shape) -> "TensorType":
        return TensorType(tuple(shape), self.dtype, self.layout)

    def with_dtype(self, dtype: str) -> "TensorType":
        return TensorType(self.shape, dtype, self.layout)

    @staticmethod
    def of(array: np.ndarray) -> "TensorType":
        return TensorType(tuple(array.shape), dtype_of(array))

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        tail = f", {self.layout}" if self.layout else ""
        return f"tensor<[{dims}], {self.dtype}{tail}>"

    @staticmethod
    def parse(text: str) -> "TensorType":
        m = re.fullmatch(r"tensor<\[([^\]]*)\],\s*(\w+)(?:,\s*(\w+))?>", text.strip())
        if not m:
            raise ParseError(f"bad tensor type {text!r}")
        dims: list[Dim] = []
        for part in filter(None, (p.strip() for p in m.group(1).split(","))):
            dims.append(int(part) if part.lstrip("-").isdigit() else part.replace(" ", ""))
        try:
            return TensorType(tuple(dims), m.group(2), m.group(3) or "")
        except ValueError as e:
            raise ParseError(f"bad tensor type {text!r}: {e}") from None


def broadcast_shapes(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """NumPy broadcasting over int and symbolic dims; raises ValueError if incompatible."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dim: Dim = 1
        for s in shapes:
            k = i - (rank - len(s))
            if k < 0:
                continue
            d = s[k]
            if d == 1:
                continue
            if dim == 1:
                dim = d
            elif dim != d:
                raise ValueError(f"shapes {', '.join(map(str, shapes))} do not broadcast")
        out.append(dim)
    return tuple(out)
