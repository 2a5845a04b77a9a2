"""cuvil.matmul on f32: B packed in panels at compile time (the plan's "packed"), a plain
2-D GEMM over all rows of A ("gemm"), or a batch of GEMMs ("batched").
"""
from __future__ import annotations

from math import prod

from ....errors import BackendError
from ..emit import REG_TYPES, broadcast_strides, contiguous_strides, i64
from ..gemm import (blocked_gemm, emit_gemm, emit_gemm_blocked, emit_gemm_packed, packed_work_items,
                    panel_width, row_blocks)
from ..kernel_args import KernelArgs
from ..parallel import flat_offsets, parallel
from .epilogue import row_epilogue, whole_epilogue


def k_matmul(b, k: KernelArgs):
    at, bt = k.in_types[:2]
    ot = k.out_type
    m, kk, n = at.shape[-2], at.shape[-1], bt.shape[-1]
    ety = REG_TYPES[ot.dtype]
    if ot.dtype != "f32":
        raise BackendError(f"cuvil.matmul on {ot.dtype} is not supported by the backend yet")
    if k.plan.get("form") == "packed":
        return matmul_packed(b, k)
    if bt.rank == 2:
        # B is shared by every batch: one GEMM over all rows of A, row blocks in parallel.
        rows = at.numel // kk

        def gemm_block(b, k2, ib, _):
            emit_gemm(b, k2.ins[0], i64(0), kk, k2.ins[1], i64(0), n, k2.out, i64(0), n, rows, n, kk,
                      k2.vw, ety, row_epilogue(k2, 2, ot.rank - 1), blocks=(ib, b.add(ib, i64(1))))
        parallel(b, k, row_blocks(rows, k.vw), gemm_block)
        return
    batch = list(ot.shape[:-2])
    a_str = [s_ * m * kk for s_ in broadcast_strides(tuple(at.shape[:-2]), batch)]
    b_str = [s_ * kk * n for s_ in broadcast_strides(tuple(bt.shape[:-2]), batch)]
    o_str = [s_ * m * n for s_ in contiguous_strides(batch)]
    nb = row_blocks(m, k.vw)

    def batch_block(b, k2, t, _):
        bi, ib = b.sdiv(t, i64(nb)), b.srem(t, i64(nb))
        oa, ob, oo = flat_offsets(b, bi, batch, [a_str, b_str, o_str])
        emit_gemm(b, k2.ins[0], oa, kk, k2.ins[1], ob, n, k2.out, oo, n, m, n, kk, k2.vw, ety,
                  blocks=(ib, b.add(ib, i64(1))))
    parallel(b, k, prod(batch) * nb, batch_block)
    whole_epilogue(b, k, 2)


def matmul_packed(b, k: KernelArgs, weights=None, round_a=False, a=None):
    """A matmul whose B is a constant packed in panels at compile time (gemm.pack_b):
    (panel, row block) work items, or (blocked_gemm) ranges of panels, each K-blocked.
    `weights(b, k2)` / `a(b, k2)`: B's / A's pointer (default the operands; i16 for
    bfloat16 panels); `round_a`: A rounded to bfloat16 as it is read (`precision: bf16`)."""
    at, bt = k.in_types[:2]
    ot = k.out_type
    kk, n = at.shape[-1], bt.shape[-1]
    rows = at.numel // kk
    ety = REG_TYPES[ot.dtype]
    weights = weights or (lambda b, k2: k2.ins[1])
    a = a or (lambda b, k2: k2.ins[0])
    epi = row_epilogue(k, 2, ot.rank - 1)
    if epi is not None and not epi.supports_cols:
        raise BackendError("matmul epilogue cannot be applied per tile")
    if blocked_gemm(rows, n, k.vw):
        def panel_range(b, k2, panels, _):
            emit_gemm_blocked(b, a(b, k2), i64(0), kk, weights(b, k2), k2.out, i64(0), n, rows, n, kk, k2.vw, ety,
                              row_epilogue(k2, 2, ot.rank - 1), panels=panels, round_a=round_a)
        parallel(b, k, -(-n // panel_width(k.vw)), panel_range, ranges=True)
        return

    def packed_items(b, k2, t, _):
        emit_gemm_packed(b, a(b, k2), i64(0), kk, weights(b, k2), k2.out, i64(0), n, rows, n, kk, k2.vw, ety,
                         row_epilogue(k2, 2, ot.rank - 1), items=(t, b.add(t, i64(1))), round_a=round_a)
    parallel(b, k, packed_work_items(rows, n, k.vw), packed_items)
