"""The `precision: bf16` rewrite of quantize-weights: conv2d / matmul in bfloat16.

Each conv2d with a GEMM shape and each matmul with a constant 2-D B (the ops the int8
kernels take, `int8_candidate`) whose operands are f32 gets its weight as a
`cuvil.dequantize {scheme = "bf16"}` of the weight's bfloat16 bytes (half the f32 size)
and `act_quant = {dtype: bf16}`: the input is rounded to bfloat16 too, the products are
exact in f32 and summed in f32 (ir/ops/quant.py). The backend runs these in the
narrow-type GEMM (qgemm8.py) with AVX-512-BF16's `vdpbf16ps` where the target has it
and in the f32 GEMMs on bf16 operands elsewhere (qkernels.py). Everything else (depthwise convs,
attention products, elementwise ops) stays f32.
"""
from __future__ import annotations

from ..ir.ops.quant import Dequantize, as_rows, bf16_encode
from ..ir.ops.shape import Constant
from .quantize_int8 import int8_candidate

BF16_ACT = {"dtype": "bf16"}


def bf16_rewrite(fn) -> int:
    """Rewrite fn's conv2d / matmul candidates to bf16; returns how many ops changed."""
    converted: dict[tuple, object] = {}  # (id(f32 weight), out_axis) -> its bf16 dequantize
    originals, count = [], 0
    for op in list(fn.body.ops):
        if op.name not in ("cuvil.conv2d", "cuvil.matmul") or len(op.operands) < 2 or op.attrs.get("act_quant"):
            continue
        w = op.operands[1]
        c = w.defining_op
        if c is None or c.name != "cuvil.constant" or w.dtype != "f32" or op.operands[0].dtype != "f32" \
                or op.result.dtype != "f32":
            continue
        axis = int8_candidate(op)
        if axis is None:
            continue
        key = (id(w), axis)
        if key not in converted:
            q = Constant(bf16_encode(as_rows(c.value, axis)), f"{c.attrs['name']}.bf16", c.loc)
            dq = Dequantize([q.result], {"scheme": "bf16", "shape": list(w.shape), "out_axis": axis}, loc=c.loc)
            fn.body.insert_before(c, q)
            fn.body.insert_before(c, dq)
            converted[key] = dq.result
            originals.append(w)
        op.set_operand(1, converted[key])
        op.attrs["act_quant"] = dict(BF16_ACT)
        count += 1
    for w in dict.fromkeys(originals):  # the f32 originals no other op uses any more
        if not w.uses:
            fn.body.erase(w.defining_op)
    return count
