"""The `precision: bf16` rewrite of quantize-weights: conv2d / matmul in bfloat16.

Each conv2d with a GEMM shape and each matmul with a constant 2-D B (the ops the int8
kernels take, `int8_candidate`) whose operands are f32 gets its weight as a
`cuvil.dequantize {scheme = "bf16"}` of the weight's bfloat16 bytes (half the f32 size)
and `act_quant = {dtype: bf16}`: the input is rounded to bfloat16 too, the products are
exact in f32 and summed in f32 (ir/ops/quant.py). The backend runs these in the
narrow-type GEMM (backend gemm_dot.py) with AVX-512-BF16's `vdpbf16ps` where the target has it
and in the f32 GEMMs on bf16 operands elsewhere (backend kernels/quantized.py). Everything else (depthwise convs,
attention products, elementwise ops) stays f32.

A converted conv's result that only converted convs read, at least one of them in its
epilogue (a residual: the stream of a ResNet or MobileNetV2 between blocks), is rounded
to bfloat16 at the end of its own epilogue (a `fake_quant {dtype: bf16}` step of its
`post`), as the convs reading it as their input round it anyway: the values are then
bf16 wherever they are read, and a backend may keep them as bf16 codes, half the bytes
(backend kernels/bf16.py, stored_pairs). The residual additions see the rounded values (as in OpenVINO's
bf16 mode); everything else is unchanged.
"""
from __future__ import annotations

from ..ir.ops.quant import Dequantize, as_rows, bf16_encode, rounds_to_bf16
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
    outputs = {id(v) for v in fn.outputs}
    for op in fn.body.ops:
        if rounds_result(op, outputs):
            post = list(op.attrs.get("post") or [])
            last = len(op.operands) - 2 + len(post)  # the program's result slot (0: the raw result)
            post.append(["fake_quant", [last], {"dtype": "bf16"}])
            op.attrs["post"] = post
    return count


def _bf16_conv(op) -> bool:
    return op.name == "cuvil.conv2d" and (op.attrs.get("act_quant") or {}).get("dtype") == "bf16"


def rounds_result(op, outputs) -> bool:
    """Whether the bf16 conv op's result is rounded to bfloat16 in its epilogue: no
    function output (`outputs`: value ids), read only by bf16 convs (as their input or an
    epilogue operand, never as a weight), by at least one of them in its epilogue."""
    if not _bf16_conv(op):
        return False
    r = op.result
    if id(r) in outputs or not r.uses:
        return False
    in_epilogue = False
    for u in r.uses:
        slots = [i for i, v in enumerate(u.operands) if v is r]
        if not _bf16_conv(u) or 1 in slots:
            return False
        in_epilogue |= any(i >= 2 for i in slots)
    return in_epilogue and not rounds_to_bf16(op.attrs.get("post") or [])
