"""int8 GEMM with int32 accumulation: C = rescale(Q(A) @ W) or rescale(W @ Q(B)), where W
is an int8 weight (per-channel scales) and the f32 activation operand is quantized per
tensor as it is loaded (q = clamp(rint(x / s) + zp), the same arithmetic as
ir/ops/quant.fake_quant). The tile keeps MR x NV vectors of i32 accumulators; each k
step widens one row of W (or one quantized B row) to i32 and does MR * NV
multiply-adds. Finished tiles are rescaled in the epilogue:
C[., c] = f32(acc - zp * wsum[c]) * (s * wscale[c]) (wsum: the sum of channel c's codes,
so the zero point needs no per-element work).

Weight blob (`int8_blob`): the codes, padded to 64 bytes, then f32 wscale[C'] and i32
wsum[C']; a matmul's codes are [K, N] packed in panels of NR columns (gemm.pack_b's
layout, C' = the padded N), a conv2d's are its [OC, K] rows (C' = OC).

Where the target has AVX-512 VNNI the dot products could use vpdpbusd; this portable
form is what LLVM vectorises for every target (SSE/AVX2: pmaddwd-free i32 multiplies).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ...ir.ops.quant import act_bounds
from .emit import F32, i64
from .gemm import _splat, _vec_ptr, micro_shape, pack_b, panel_width
from .loops import alloca_in_entry, for_range
from .qgemm import _work_items

I8, I32 = ir.IntType(8), ir.IntType(32)


def _pad64(n: int) -> int:
    return -(-n // 64) * 64


def int8_blob(codes_rows: np.ndarray, scale: np.ndarray, packed: bool, vw: int) -> np.ndarray:
    """codes_rows [C, K] i8, scale [C] f32 -> the weight blob above (u8)."""
    wsum = codes_rows.astype(np.int32).sum(axis=1)
    if packed:
        codes = pack_b(np.ascontiguousarray(codes_rows.T), vw)
        cp = codes.shape[0] * panel_width(vw)
        scale = np.concatenate([scale, np.zeros(cp - len(scale), np.float32)])
        wsum = np.concatenate([wsum, np.zeros(cp - len(wsum), np.int32)])
    else:
        codes = codes_rows
    raw = codes.astype(np.int8).tobytes()
    head = raw + b"\0" * (_pad64(len(raw)) - len(raw))
    return np.frombuffer(head + scale.astype("<f4").tobytes() + wsum.astype("<i4").tobytes(), np.uint8)


def blob_parts(b, blob, code_bytes: int, channels: int):
    """(codes i8*, wscale f32*, wsum i32*) inside a weight blob (i8*)."""
    off = _pad64(code_bytes)
    scale = b.bitcast(b.gep(blob, [i64(off)], inbounds=True), F32.as_pointer())
    wsum = b.bitcast(b.gep(blob, [i64(off + 4 * channels)], inbounds=True), I32.as_pointer())
    return blob, scale, wsum


def _fcall(b, name, args):
    """A float intrinsic (llvm.rint, llvm.maxnum, ...) on f32 or <n x f32> operands."""
    ty = args[0].type
    full = f"{name}.v{ty.count}f32" if isinstance(ty, ir.VectorType) else f"{name}.f32"
    fn = b.module.globals.get(full) or ir.Function(b.module, ir.FunctionType(ty, [ty] * len(args)), name=full)
    return b.call(fn, list(args))


def _quantize(b, x, aq):
    """f32 (scalar or vector) -> i32 codes, as fake_quant rounds them."""
    lo, hi = act_bounds(aq)
    ty = x.type

    def c(v):
        return ir.Constant(ty, [v] * ty.count) if isinstance(ty, ir.VectorType) else ir.Constant(ty, v)
    inv = float(np.float32(1.0 / aq["scale"]))
    q = b.fadd(_fcall(b, "llvm.rint", [b.fmul(x, c(inv))]), c(float(aq["zero_point"])))
    q = _fcall(b, "llvm.minnum", [_fcall(b, "llvm.maxnum", [q, c(float(lo))]), c(float(hi))])
    ity = ir.VectorType(I32, ty.count) if isinstance(ty, ir.VectorType) else I32
    return b.fptosi(q, ity)


def _tile(b, K, mr, nv, vw, operands, rescale, C, c_row0, ldc, c_j0, valid):
    """i32 accumulation over K (operands(k) -> (mr splatted A vectors, nv B vectors),
    all <vw x i32>), then rescale(acc, r, v) -> <vw x f32> stored into C."""
    vty = ir.VectorType(I32, vw)
    accs = [[alloca_in_entry(b, vty) for _ in range(nv)] for _ in range(mr)]
    for row in accs:
        for a in row:
            b.store(ir.Constant(vty, [0] * vw), a)
    with for_range(b, K, name="k") as k:
        av, bv = operands(k)
        for r in range(mr):
            for v in range(nv):
                b.store(b.add(b.load(accs[r][v]), b.mul(av[r], bv[v])), accs[r][v])
    fty = ir.VectorType(F32, vw)
    full = nv * vw if valid is None else (valid // vw) * vw
    for r in range(mr):
        crow = b.add(b.add(c_row0, i64(r * ldc)), c_j0)
        for v in range(-(-(nv * vw if valid is None else valid) // vw)):
            out = rescale(b.load(accs[r][v]), r, v)
            if v < full // vw:
                b.store(out, _vec_ptr(b, C, b.add(crow, i64(v * vw)), fty), align=4)
            else:  # the ragged end of the last panel
                for j in range(valid - full):
                    x = b.extract_element(out, ir.Constant(I32, j))
                    b.store(x, b.gep(C, [b.add(crow, i64(full + j))], inbounds=True))


def emit_i8b_gemm(b, A, lda, blob, C, ldc, M, N, K, vw, aq, epilogue, items):
    """C = A @ W: A f32 [M, K] quantized on load, W int8 [K, N] in panels (int8_blob)."""
    mr_full, nv = micro_shape(vw)
    nr = nv * vw
    cp = -(-N // nr) * nr
    codes, wscale, wsum = blob_parts(b, blob, K * cp, cp)
    ity, fty = ir.VectorType(I32, vw), ir.VectorType(F32, vw)
    zp, s = aq["zero_point"], float(np.float32(aq["scale"]))

    def tile(row0, mr, p, valid):
        j0 = b.mul(p, i64(nr))
        panel = b.mul(p, i64(K * nr))

        def operands(k):
            brow = b.add(panel, b.mul(k, i64(nr)))
            bv = [b.sext(b.load(_vec_ptr(b, codes, b.add(brow, i64(v * vw)), ir.VectorType(I8, vw)), align=1), ity)
                  for v in range(nv)]
            av = [_splat(b, _quantize(b, b.load(b.gep(A, [b.add(b.mul(b.add(row0, i64(r)), i64(lda)), k)],
                                                       inbounds=True)), aq), ity) for r in range(mr)]
            return av, bv

        def rescale(acc, r, v):
            col = b.add(j0, i64(v * vw))
            ws = b.load(_vec_ptr(b, wsum, col, ity), align=4)
            sc = b.fmul(b.load(_vec_ptr(b, wscale, col, fty), align=4), ir.Constant(fty, [s] * vw))
            fixed = b.sub(acc, b.mul(ws, ir.Constant(ity, [zp] * vw))) if zp else acc
            return b.fmul(b.sitofp(fixed, fty), sc)
        _tile(b, K, mr, nv, vw, operands, rescale, C, b.mul(row0, i64(ldc)), ldc, j0, valid)
        if epilogue is not None:
            epilogue(b, row0, mr, j0, nr if valid is None else valid)
    _work_items(b, M, N, vw, items, tile)


def emit_i8a_gemm(b, blob, a_row_off, rows_total, Bp, C, c_off, ldc, M, N, K, vw, aq, epilogue, items):
    """C = W @ B: W int8 [rows, K] rows (int8_blob; rows from a_row_off, an i64), B f32
    [K, N] packed in panels and quantized on load."""
    mr_full, nv = micro_shape(vw)
    nr = nv * vw
    codes, wscale, wsum = blob_parts(b, blob, rows_total * K, rows_total)
    ity, fty = ir.VectorType(I32, vw), ir.VectorType(F32, vw)
    zp, s = aq["zero_point"], float(np.float32(aq["scale"]))

    def tile(row0, mr, p, valid):
        rows = b.add(a_row_off, row0)
        panel = b.mul(p, i64(K * nr))

        def operands(k):
            brow = b.add(panel, b.mul(k, i64(nr)))
            bv = [_quantize(b, b.load(_vec_ptr(b, Bp, b.add(brow, i64(v * vw)), fty), align=4), aq)
                  for v in range(nv)]
            av = [_splat(b, b.sext(b.load(b.gep(codes, [b.add(b.mul(b.add(rows, i64(r)), i64(K)), k)],
                                                 inbounds=True)), I32), ity) for r in range(mr)]
            return av, bv

        def rescale(acc, r, v):
            row = b.add(rows, i64(r))
            ws = _splat(b, b.load(b.gep(wsum, [row], inbounds=True)), ity)
            sc = _splat(b, b.fmul(b.load(b.gep(wscale, [row], inbounds=True)), ir.Constant(F32, s)), fty)
            fixed = b.sub(acc, b.mul(ws, ir.Constant(ity, [zp] * vw))) if zp else acc
            return b.fmul(b.sitofp(fixed, fty), sc)
        _tile(b, K, mr, nv, vw, operands, rescale, C, b.add(c_off, b.mul(row0, i64(ldc))), ldc, b.mul(p, i64(nr)),
              valid)
        if epilogue is not None:
            epilogue(b, row0, mr, b.mul(p, i64(nr)), nr if valid is None else valid)
    _work_items(b, M, N, vw, items, tile)
