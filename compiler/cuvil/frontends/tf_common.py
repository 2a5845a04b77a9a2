"""What the TensorFlow frontend's modules share: the handler table, the dtype and layout
tables, the NCHW result marker and the operand readers.

`tf_ops.py` and `tf_shape_ops.py` register their handlers in HANDLERS with `@handles`;
`tf.py` imports them and looks nodes up there. This module imports nothing else of the
frontend, so the three import it and none imports another.
"""
from __future__ import annotations

import numpy as np

from ..errors import FrontendError, UnsupportedOpError
from ..ir import Value
from .graph import registrar

TF_DTYPES = {"float32": "f32", "float16": "f16", "float64": "f64", "int64": "i64", "int32": "i32",
             "int8": "i8", "uint8": "u8", "bool": "bool"}
NHWC_TO_NCHW = [0, 3, 1, 2]
NCHW_TO_NHWC = [0, 2, 3, 1]

HANDLERS: dict = {}  # op type ('Conv2D') -> handler(low, node)


def cuvil_dtype(tf_dtype) -> str:
    import tensorflow as tf
    name = tf.as_dtype(tf_dtype).name
    if name not in TF_DTYPES:
        raise FrontendError(f"TensorFlow dtype {name} is not supported")
    return TF_DTYPES[name]


class NCHW:
    """A handler result: this value is the NCHW form of the node's (NHWC) output."""

    __slots__ = ("value",)

    def __init__(self, value: Value):
        self.value = value


handles = registrar(HANDLERS)


def operand(low, node, i: int = 0) -> Value:
    """The node's input i in TensorFlow's own layout."""
    return low.get(node.inputs[i])


def static_operand(low, node, i: int, what: str) -> np.ndarray:
    """The node's input i, which must be known at compile time."""
    return low.static(operand(low, node, i), f"{what} of {node.op}")


def norm_axis(d: int, rank: int) -> int:
    """Axis d (negative counts from the end) as 0 <= d < rank."""
    d = int(d)
    if not -rank <= d < max(rank, 1):
        raise UnsupportedOpError(f"axis {d} is out of range for rank {rank}")
    return d + rank if d < 0 else d
