"""cuvil.attention: softmax(Q K^T * scale + mask) V without the score matrix in memory,
blocks of query rows at a time, their scores in a small buffer per thread.
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

from llvmlite import ir

from ....errors import BackendError
from ....ir.ops.nn import Attention
from ..emit import F32, i64
from ..gemm import emit_gemm, micro_shape
from ..kernel_args import KernelArgs
from ..loops import alloca_in_entry, for_range
from ..parallel import parallel
from .epilogue import row_epilogue
from .rows import SOFTMAX_ROWS, softmax_in_registers, softmax_row, softmax_rows_in_registers


# The fused attention's stack buffer of scores (each thread's block of query rows, at
# most a micro-tile's height of them), small enough for any thread's stack (wasm's 1 MiB
# included): long key sequences take fewer rows a block.
ATTENTION_BUF_BYTES = 32 << 10


def k_attention(b, k: KernelArgs):
    """cuvil.attention per (batch, block of R query rows): scores = q @ kt into a stack
    buffer (emit_gemm), the scores' program applied to it in vectors, softmax of its rows
    in place (in registers where they fit), then out rows = buffer @ v: the score matrix
    is never written out, and each block's scores stay in L1."""
    qt, ktt, vt = k.in_types[:3]
    s_len, d = qt.shape[-2:]
    sk, dv = ktt.shape[-1], vt.shape[-1]
    batch = prod(qt.shape[:-2])
    vw = k.vw
    rows_max = max(1, min(micro_shape(vw)[0], s_len, ATTENTION_BUF_BYTES // (4 * sk)))
    blocks = -(-s_len // rows_max)
    scores_t = Attention.scores_type(k.in_types)
    vty, one = ir.VectorType(F32, vw), ir.VectorType(F32, 1)

    def item(b, k2, t, _):
        bi, blk = b.sdiv(t, i64(blocks)), b.srem(t, i64(blocks))
        slot = alloca_in_entry(b, ir.ArrayType(F32, rows_max * sk))
        slot.align = 64
        buf = b.bitcast(slot, F32.as_pointer())
        epi = row_epilogue(replace(k2, out_type=scores_t), 3, scores_t.rank - 1)
        if epi is not None and epi.apply is None:
            raise BackendError("cuvil.attention: the scores' program does not run on vectors")

        def rows_of(r0, rows: int):
            grow = b.add(b.mul(bi, i64(s_len)), r0)  # the block's first row of q / of the scores
            emit_gemm(b, k2.ins[0], b.mul(grow, i64(d)), d, k2.ins[1], b.mul(bi, i64(d * sk)), sk, buf, i64(0), sk,
                      rows, sk, d, vw, F32)
            if epi is not None:
                for r in range(rows):
                    for c in range(0, sk - sk % vw, vw):
                        ptr = b.bitcast(b.gep(buf, [i64(r * sk + c)], inbounds=True), vty.as_pointer())
                        b.store(epi.apply(b, b.add(grow, i64(r)), i64(c), b.load(ptr, align=4)), ptr, align=4)
                    for c in range(sk - sk % vw, sk):  # the tail, as one-lane vectors
                        ptr = b.bitcast(b.gep(buf, [i64(r * sk + c)], inbounds=True), one.as_pointer())
                        b.store(epi.apply(b, b.add(grow, i64(r)), i64(c), b.load(ptr, align=4)), ptr, align=4)
            if softmax_in_registers(sk, vw):
                for r in range(0, rows, SOFTMAX_ROWS):
                    softmax_rows_in_registers(b, buf, buf, vw, i64(r), min(SOFTMAX_ROWS, rows - r), sk)
            else:
                with for_range(b, rows, name="sr") as r:
                    softmax_row(b, buf, buf, vw, r, sk, 1, "f32", False)
            emit_gemm(b, buf, i64(0), sk, k2.ins[2], b.mul(bi, i64(sk * dv)), dv, k2.out, b.mul(grow, i64(dv)), dv,
                      rows, dv, sk, vw, F32)

        last = s_len - (blocks - 1) * rows_max
        if last == rows_max:
            rows_of(b.mul(blk, i64(rows_max)), rows_max)
        else:
            with b.if_else(b.icmp_signed("<", blk, i64(blocks - 1))) as (whole, short):
                with whole:
                    rows_of(b.mul(blk, i64(rows_max)), rows_max)
                with short:
                    rows_of(i64((blocks - 1) * rows_max), last)
    parallel(b, k, batch * blocks, item)
