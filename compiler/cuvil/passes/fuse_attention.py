"""fuse-attention: matmul -> softmax -> matmul into one `cuvil.attention` op (ir/ops/nn.py),
whose kernel keeps each block of query rows' scores in a small buffer and never
writes the score matrix out:

    %s = matmul(%q, %kt, %mask) {post = [scale, mask]}
    %p = softmax(%s) {axis = last}                     ->  %o = attention(%q, %kt, %v, %mask) {post = ...}
    %o = matmul(%p, %v)

Only where the scores and the probabilities have no other user (not a graph output
either), the products are f32 without an int8 / bf16 activation quantization, all
shapes are static, q, kt and v share their leading dims (no broadcasting) and the
scores' program is one the kernel applies to vectors in registers (f32 operands, the
arithmetic of emit.VECTOR_FLOAT_OPS); and only where the score matrix would take at
least MIN_SCORE_BYTES.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..backend.llvm.emit import VECTOR_FLOAT_OPS
from ..ir import Module, Op
from .rewrite import add_op, erase_if_dead, replace_op, single_user


# Smaller score matrices stay in L2 between the unfused ops, whose packed GEMMs are the
# faster ones; from about an L2's size (1 MiB) on, fusing breaks even, and it gains the
# more the larger the scores.
MIN_SCORE_BYTES = 1 << 20


def _plain_f32(op: Op) -> bool:
    return (not op.attrs.get("act_quant") and op.result.dtype == "f32"
            and all(v.dtype == "f32" for v in op.operands[:2])
            and all(isinstance(d, int) for v in op.operands[:2] for d in v.shape))


def fuse(scores_op: Op) -> Op | None:
    """The attention op replacing scores_op's matmul -> softmax -> matmul chain, or None."""
    if scores_op.name != "cuvil.matmul" or not _plain_f32(scores_op):
        return None
    soft = single_user(scores_op.result)
    if soft is None or soft.name != "cuvil.softmax" or soft.attrs["axis"] != soft.result.type.rank - 1:
        return None
    out = single_user(soft.result)
    if out is None or out.name != "cuvil.matmul" or len(out.operands) != 2 or out.operands[0] is not soft.result \
            or out.attrs.get("post") or not _plain_f32(out):
        return None
    if scores_op.result.type.numel * 4 < MIN_SCORE_BYTES:
        return None
    q, kt = scores_op.operands[:2]
    v = out.operands[1]
    if not (q.type.rank == kt.type.rank == v.type.rank) or not (q.shape[:-2] == kt.shape[:-2] == v.shape[:-2]):
        return None
    post = scores_op.attrs.get("post") or []
    if any(x.dtype != "f32" for x in scores_op.operands[2:]) or any(step[0] not in VECTOR_FLOAT_OPS for step in post):
        return None
    attrs = {"post": post} if post else {}
    new = add_op(out.parent, out, "cuvil.attention", [q, kt, v, *scores_op.operands[2:]], attrs, out.loc)
    replace_op(out, [new.result])
    erase_if_dead(soft)  # and the scores' matmul with it
    return new


@dataclass(frozen=True)
class FuseAttention:
    name = "fuse-attention"

    def apply(self, module: Module) -> None:
        for fn in module.all_functions():
            for op in [op for op in fn.body.ops if op.name == "cuvil.matmul"]:
                if op.parent is not None:
                    fuse(op)
