"""Quantized weights as kernels see them: a conv2d's or matmul's weight scheme (int4,
int8, bf16), the scratch of an int8 matmul's quantized A, the dot product a kernel
runs.
"""
from __future__ import annotations

import numpy as np

from ..gemm_dot import I16
from ..kernel_args import KernelArgs
from ..target import GENERIC_BF16, GENERIC_INT8


CONSUMERS = {"cuvil.matmul": 1, "cuvil.conv2d": 0}  # op -> the out_axis its kernel reads


def quantized_weight(op) -> str | None:
    """The scheme of op's quantized weight, if op is a conv2d/matmul that reads one."""
    if op.name not in CONSUMERS or len(op.operands) < 2:
        return None
    d = op.operands[1].defining_op
    return d.attrs["scheme"] if d is not None and d.name == "cuvil.dequantize" else None

QROWS = 16  # rows of A per task of the matmul's quantization pass

# schemes whose kernels need the op's act_quant (the activations are converted too)
ACT_SCHEMES = ("int8_channel", "bf16")


def int8_scratch_bytes(op) -> int:
    """Scratch of an int8 (or bf16) matmul: its A's codes, [M][Kg][G] (at most 2 bytes a
    code, K padded to a multiple of 4; bf16 ones 4 bytes, for the plain kernels' rounded
    f32 A); 0 where M is a runtime size (the tiles quantize their own rows then)."""
    if op.name != "cuvil.matmul" or not op.attrs.get("act_quant") or quantized_weight(op) not in ACT_SCHEMES:
        return 0
    shape = op.operands[0].type.shape
    if not all(isinstance(d, int) for d in shape):
        return 0
    k = shape[-1]
    # 2 bytes a code; a bf16 one has 4 (the plain bf16 kernels keep A as rounded f32)
    code_bytes = 4 if quantized_weight(op) == "bf16" else 2
    return int(np.prod(shape[:-1], dtype=np.int64)) * (-(-k // 4) * 4) * code_bytes


def isa_of(k: KernelArgs, aq):
    """The dot product of this kernel's integer / bf16 GEMM."""
    if aq and aq["dtype"] == "bf16":
        return k.bf16 or GENERIC_BF16
    return k.int8 or GENERIC_INT8


def bf16_bits(b, k2):
    return b.bitcast(k2.ins[1], I16.as_pointer())
