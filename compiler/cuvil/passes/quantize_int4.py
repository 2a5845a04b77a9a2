"""The int4_block rewrite of quantize-weights: one conv2d / matmul weight to Q4_0 blocks.

A weight becomes `cuvil.dequantize(u8 constant) {scheme = "int4_block"}` (the layout is
documented in ir/ops/quant.py): blocks of 32 along the reduction, per output channel,
one f16 scale per block; 18 bytes per 32 weights, 0.14 of the f32 bytes. The blocks run
along K of a matmul B [K, N] (one column of B per output channel) and along
IC/g * KH * KW of a conv2d weight [OC, IC/g, KH, KW].

Only weights that the backend's int4 GEMM kernels read get it: a 2-D matmul B with
K >= 32, a conv2d with a reduction of >= 32 and >= 4 output channels per group. Smaller
reductions (depthwise 3x3 convs: 9 weights per channel) would pad to 32 and save
nothing; those weights get fp16 instead.
"""
from __future__ import annotations

import numpy as np

from ..ir import Op
from ..ir.ops.quant import QK, Dequantize, as_rows, q4_encode
from ..ir.ops.shape import Constant


def int4_layout(op: Op) -> int | None:
    """The out_axis of op's weight (operand 1) in int4_block, or None if it stays wider."""
    w = op.operands[1].type
    if op.name == "cuvil.matmul":
        return 1 if w.rank == 2 and w.shape[0] >= QK else None
    if op.name == "cuvil.conv2d":
        oc, icg, kh, kw = w.shape
        return 0 if icg * kh * kw >= QK and oc // op.attrs["groups"] >= 4 else None
    return None


def int4_weight(fn, const: Op, out_axis: int):
    """Insert the quantized copy of `const` before it; return the dequantized value."""
    w = const.value.astype(np.float32)
    q = Constant(q4_encode(as_rows(w, out_axis)), f"{const.attrs['name']}.q4", const.loc)
    fn.body.insert_before(const, q)
    dq = Dequantize([q.result], {"scheme": "int4_block", "shape": list(w.shape), "out_axis": out_axis},
                    loc=const.loc)
    fn.body.insert_before(const, dq)
    return dq.result
