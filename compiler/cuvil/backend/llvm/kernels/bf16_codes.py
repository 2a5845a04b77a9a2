"""bfloat16 codes of f32 vectors for plane pairs: one pixel's two channel vectors as the
codes of their pairs (pair_codes, concat_codes).
"""
from __future__ import annotations

from llvmlite import ir

from ..emit import F32
from ..gemm_dot import bf16_codes2, group_codes


def pair_codes(b, v0, v1, isa):
    """The bf16 codes of two planes' vectors interleaved: element j holds plane 0's code
    in its low 16 bits, plane 1's in its high ones (as <vw x f32> bits)."""
    vw = v0.type.count
    return b.bitcast(group_codes(b, [v0, v1], None, isa, vw), ir.VectorType(F32, vw))


def concat_codes(b, v0, v1, isa):
    """The bf16 codes of v0's lanes then v1's (as <vw x f32> bits): element j holds
    lanes 2j and 2j + 1 of the pair (v0, v1) joined, low then high 16 bits; from a
    pixel's vectors of consecutive channels, element j is channel pair j's."""
    vw = v0.type.count
    return b.bitcast(bf16_codes2(b, v0, v1), ir.VectorType(F32, vw))
