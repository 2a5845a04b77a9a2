"""What the ONNX frontend's modules share: the handler table, the element types and
the operand readers.

`onnx_ops.py` and `onnx_shape_ops.py` register their handlers in HANDLERS with
`@handles`; `onnx.py` imports them and looks nodes up there. This module imports
nothing else of the frontend, so the three import it and none imports another.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from .graph import SymDim, registrar

# TensorProto.DataType -> Cuvil dtype (those the IR has).
ONNX_DTYPES = {1: "f32", 2: "u8", 3: "i8", 6: "i32", 7: "i64", 9: "bool", 10: "f16", 11: "f64"}

HANDLERS: dict = {}  # op type ('Conv') -> handler(low, node)


def cuvil_dtype(elem_type: int) -> str:
    if elem_type not in ONNX_DTYPES:
        import onnx
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() \
            else str(elem_type)
        raise UnsupportedOpError(f"ONNX element type {name} is not supported")
    return ONNX_DTYPES[elem_type]


handles = registrar(HANDLERS)


def operand(low, node, i: int = 0) -> Value | None:
    """The value of the node's input i; None where it is omitted."""
    return low.get(node.inputs[i]) if i < len(node.inputs) else None


def int_list(low, node, i: int, what: str, attr: str | None = None, default=None):
    """An int list given as input i (newer opsets) or as attribute `attr` (older ones)."""
    v = operand(low, node, i)
    if v is not None:  # symbolic dims (from Shape) come back as their dim text
        return [SymDim.unwrap(a) for a in np.ravel(low.static(v, f"{what} of {node.op}"))]
    if attr is not None and attr in node.attrs:
        return [int(a) for a in np.ravel(node.attr(attr))]
    return default


def scalar(low, node, i: int, what: str):
    """Input i as a compile-time scalar; None where it is omitted."""
    v = operand(low, node, i)
    return None if v is None else np.ravel(low.static(v, f"{what} of {node.op}"))[0]


def norm_axis(d: int, rank: int) -> int:
    """Axis d (negative counts from the end) as 0 <= d < rank."""
    d = int(d)
    if not -rank <= d < max(rank, 1):
        raise UnsupportedOpError(f"axis {d} is out of range for rank {rank}")
    return d + rank if d < 0 else d
