"""int4_block GEMM: C[M, N] = A[M, K] @ B[K, N] where one operand is 4-bit (Q4_0 blocks,
see ir/ops/quant.py) and is dequantised into registers inside the K loop.

The K loop runs over blocks of 32: per block the scales are loaded once, then each of
16 code bytes yields two reduction steps (k = kk from the low nibble, k = kk + 16 from
the high one), each a dequantise (c * d - 8d, one FMA) and MR * NV multiply-adds with
f32 accumulation, as in gemm.py's micro-kernel. Two operand forms:

- `emit_q4b_gemm`: B is the int4 weight (a matmul's B), stored in panels of NR columns
  (`pack_q4_panels`): per panel and block, NR f16 scales and then 16 rows of NR code
  bytes, so one block row of the panel is NV vector loads;
- `emit_q4a_gemm`: A is the int4 weight (a conv2d's [OC, K] rows, plain Q4_0 rows),
  B an f32 panel packed by gemm.pack_b / the im2col packer.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ...ir.ops.quant import Q4_BLOCK_BYTES, QK
from .emit import F16, F32, i64
from .gemm import CONTRACT, splat, vec_ptr, micro_shape, packed_items, panel_width
from .loops import alloca_in_entry, for_range

I8 = ir.IntType(8)
HALF = QK // 2


def pack_q4_panels(q: np.ndarray, vw: int) -> np.ndarray:
    """[N, nb, 18] Q4_0 rows (row n = column n of B) -> the panel layout above, as u8
    [panels, nb, 18 * NR]; columns past N have scale 0 (they multiply to 0)."""
    n, nb, _ = q.shape
    nr = panel_width(vw)
    panels = -(-n // nr)
    padded = np.zeros((panels * nr, nb, Q4_BLOCK_BYTES), np.uint8)
    padded[:n] = q
    x = padded.reshape(panels, nr, nb, Q4_BLOCK_BYTES).transpose(0, 2, 1, 3)   # p, kb, column, byte
    scales = x[..., :2].reshape(panels, nb, 2 * nr)
    codes = x[..., 2:].transpose(0, 1, 3, 2).reshape(panels, nb, HALF * nr)   # p, kb, code row, column
    return np.ascontiguousarray(np.concatenate([scales, codes], axis=2))


def _byte_ptr(b, base, offset, ty):
    return b.bitcast(b.gep(base, [offset], inbounds=True), ty.as_pointer())


def _nibbles(b, byte, hi: bool):
    """The high (hi) or low nibble of an i8 or <n x i8> value."""
    t = byte.type
    const = (lambda v: ir.Constant(t, [v] * t.count)) if isinstance(t, ir.VectorType) else t
    return b.lshr(byte, const(4)) if hi else b.and_(byte, const(15))


def _dequant(b, codes, scale, neg8, fty):
    """codes (i8, 0..15) -> (c - 8) * d as c * d + (-8 d)."""
    return b.fadd(b.fmul(b.uitofp(codes, fty), scale, flags=CONTRACT), neg8, flags=CONTRACT)


def _k_blocks(b, K: int, block):
    """block(kb) -> step(kk, hi); step runs for every k = 32 kb + kk + 16 hi < K."""
    full, tail = divmod(K, QK)
    if full:
        with for_range(b, full, name="kb") as kb:
            step = block(kb)
            with for_range(b, HALF, name="kk") as kk:
                step(kk, False)
                step(kk, True)
    if tail:
        step = block(i64(full))
        with for_range(b, min(HALF, tail), name="kl") as kk:
            step(kk, False)
        if tail > HALF:
            with for_range(b, tail - HALF, name="kh") as kk:
                step(kk, True)


def _run_tile(b, K, mr, nv, vw, block, C, c_row0, ldc, c_j0, valid):
    """Accumulate sum_k a[r](k) * b[v](k) over K (block(kb) -> step(kk, hi) -> (a, bv):
    mr splatted A vectors and nv B vectors) and store the tile into C."""
    vty = ir.VectorType(F32, vw)
    accs = [[alloca_in_entry(b, vty) for _ in range(nv)] for _ in range(mr)]
    for row in accs:
        for a in row:
            b.store(ir.Constant(vty, [0.0] * vw), a)

    def outer(kb):
        values = block(kb)

        def step(kk, hi):
            av, bv = values(kk, hi)
            for r in range(mr):
                for v in range(nv):
                    acc = accs[r][v]
                    b.store(b.fadd(b.load(acc), b.fmul(av[r], bv[v], flags=CONTRACT), flags=CONTRACT), acc)
        return step
    _k_blocks(b, K, outer)
    full = nv * vw if valid is None else (valid // vw) * vw
    for r in range(mr):
        crow = b.add(b.add(c_row0, i64(r * ldc)), c_j0)
        for v in range(full // vw):
            b.store(b.load(accs[r][v]), vec_ptr(b, C, b.add(crow, i64(v * vw)), vty), align=4)
        if valid is not None and valid > full:  # the ragged end of the last panel
            vec = b.load(accs[r][full // vw])
            for j in range(valid - full):
                x = b.extract_element(vec, ir.Constant(ir.IntType(32), j))
                b.store(x, b.gep(C, [b.add(crow, i64(full + j))], inbounds=True))


def emit_q4b_gemm(b, A, lda, Bq, C, ldc, M, N, K, vw, epilogue, items):
    """C = A @ B, A f32 [M, K] (row stride lda), B int4 in panels (Bq: i8*, pack_q4_panels).
    `epilogue(b, row0, rows, col0, cols)` runs on each finished tile."""
    mr_full, nv = micro_shape(vw)
    nr = nv * vw
    nb = -(-K // QK)
    vty = ir.VectorType(F32, vw)

    def tile(row0, mr, p, valid):
        a_row0 = b.mul(row0, i64(lda))
        panel = b.mul(p, i64(nb * Q4_BLOCK_BYTES * nr))

        def block(kb):
            base = b.add(panel, b.mul(kb, i64(Q4_BLOCK_BYTES * nr)))
            hty = ir.VectorType(F16, vw)
            scale = [b.fpext(b.load(_byte_ptr(b, Bq, b.add(base, i64(2 * v * vw)), hty), align=2), vty)
                     for v in range(nv)]
            neg8 = [b.fmul(s, ir.Constant(vty, [-8.0] * vw)) for s in scale]
            codes0 = b.add(base, i64(2 * nr))
            k0 = b.mul(kb, i64(QK))

            def values(kk, hi):
                k = b.add(b.add(k0, kk), i64(HALF if hi else 0))
                row = b.add(codes0, b.mul(kk, i64(nr)))
                cty = ir.VectorType(I8, vw)
                bv = [_dequant(b, _nibbles(b, b.load(_byte_ptr(b, Bq, b.add(row, i64(v * vw)), cty), align=1), hi),
                               scale[v], neg8[v], vty) for v in range(nv)]
                av = [splat(b, b.load(b.gep(A, [b.add(b.add(a_row0, i64(r * lda)), k)], inbounds=True)), vty)
                      for r in range(mr)]
                return av, bv
            return values
        j0 = b.mul(p, i64(nr))
        _run_tile(b, K, mr, nv, vw, block, C, b.mul(row0, i64(ldc)), ldc, j0, valid)
        if epilogue is not None:
            epilogue(b, row0, mr, j0, nr if valid is None else valid)
    packed_items(b, M, N, vw, items, tile)


def emit_q4a_gemm(b, Aq, a_row_off, Bp, C, c_off, ldc, M, N, K, vw, epilogue, items, panel_at=None):
    """C = A @ B, A int4 Q4_0 rows (Aq: i8*; rows from a_row_off, an i64 row index), B an
    f32 [K, N] packed in panels (gemm.pack_b layout). `epilogue` as in emit_q4b_gemm;
    `panel_at` (i64): every panel is read from that panel slot of Bp (one panel)."""
    mr_full, nv = micro_shape(vw)
    nr = nv * vw
    row_bytes = -(-K // QK) * Q4_BLOCK_BYTES
    vty = ir.VectorType(F32, vw)

    def tile(row0, mr, p, valid):
        a_rows = b.add(a_row_off, row0)
        b_panel = b.mul(p if panel_at is None else panel_at, i64(K * nr))

        def block(kb):
            bases = [b.add(b.mul(b.add(a_rows, i64(r)), i64(row_bytes)), b.mul(kb, i64(Q4_BLOCK_BYTES)))
                     for r in range(mr)]
            scale = [b.fpext(b.load(_byte_ptr(b, Aq, base, F16), align=1), F32) for base in bases]
            neg8 = [b.fmul(s, ir.Constant(F32, -8.0)) for s in scale]
            k0 = b.mul(kb, i64(QK))

            def values(kk, hi):
                k = b.add(b.add(k0, kk), i64(HALF if hi else 0))
                brow = b.add(b_panel, b.mul(k, i64(nr)))
                bv = [b.load(vec_ptr(b, Bp, b.add(brow, i64(v * vw)), vty), align=4) for v in range(nv)]
                av = []
                for r in range(mr):
                    byte = b.load(b.gep(Aq, [b.add(bases[r], b.add(kk, i64(2)))], inbounds=True))
                    av.append(splat(b, _dequant(b, _nibbles(b, byte, hi), scale[r], neg8[r], F32), vty))
                return av, bv
            return values
        j0 = b.mul(p, i64(nr))
        _run_tile(b, K, mr, nv, vw, block, C, b.add(c_off, b.mul(row0, i64(ldc))), ldc, j0, valid)
        if epilogue is not None:
            epilogue(b, row0, mr, j0, nr if valid is None else valid)
    packed_items(b, M, N, vw, items, tile)
