"""Narrow-type GEMM: int8 with int32 accumulation, C = rescale(Q(A) @ W) (matmul) or
rescale(W @ Q(B)) (conv2d as GEMM), where W holds int8 weight codes (per-channel scales)
and the f32 activation operand is quantized per tensor ONCE, before the product, into a
code buffer (q = clamp(rint(x / s) + zp, qmin, qmax), the arithmetic of
ir/ops/quant.fake_quant); and bfloat16 with f32 accumulation (`precision: bf16`), the
same schedule and layouts with G = 2 and bf16 codes (below).

The reduction runs over groups of G consecutive k (G = `DotIsa.group`):

- G = 2 (`pmaddwd`, `generic`): activation codes are stored as i16 `q - zp` (so the zero
  point needs no correction) and weights are sign-extended to i16; one step multiplies
  a pair of activations by a pair of weights per output and adds both products to an
  i32 lane (x86 `vpmaddwd`: i16 x i16 -> i32, exact, no saturation for these ranges;
  elsewhere the same arithmetic in plain IR).
- G = 4 (`vpdpbusd`, `generic4`): activation codes are stored as u8 `u = q - off` (off
  = 0 for u8, -128 for i8 activations) and weights stay i8; one step adds four u8 x i8
  products to an i32 lane (x86 AVX-VNNI / AVX512-VNNI `vpdpbusd`, exact, no
  saturation). The zero point is applied in the epilogue: acc + (off - zp) * wsum[c].
- G = 4 signed (`sdot`, `generic4s`): the same layouts with activation codes stored as
  i8 `q - off` (off = 128 for u8, 0 for i8 activations): four i8 x i8 products per i32
  lane (AArch64 `sdot`, the dot-product extension), the same epilogue correction.

- G = 2 bfloat16 (`dpbf16ps`): codes are the i16 bits of bf16 values (activations
  rounded to nearest even once, weights stored so); one step adds a pair of exact
  bf16 x bf16 products to an f32 lane (x86 AVX-512-BF16 `vdpbf16ps`). The accumulators
  are f32 and need no rescale. Targets without it (the `bf16` isa) run the f32 GEMMs of
  gemm.py on bf16 operands instead (kernels/quantized.py).

K is padded with zeros to a multiple of G (weights and activations), so the padding
adds nothing. Finished tiles are rescaled: C[., c] = f32(acc + corr * wsum[c]) *
(s * wscale[c]), then the op's epilogue (bias, activation, residual) runs in f32.

Layouts (Kg = ceil(K / G), NR = panel_width(vw), AP = NR positions per im2col panel):
- matmul weight blob: codes in panels of NR columns, panel p = [Kg][NR][G] i8 (group
  kg of column j is G contiguous bytes; a vector covers vw columns x G k's).
- conv2d weight blob: the [OC, Kg * G] rows (a row's group is G contiguous bytes).
  Both: the codes padded to 64 bytes, then f32 wscale[C'] and i32 wsum[C'] (C' = the
  padded N for a matmul, OC for a conv).
- matmul activations (scratch): [M][Kg][G] codes (one group is one i32, broadcast).
- conv2d activations (scratch): the f32 im2col panel [K][AP] is rewritten in place as
  [Kg][AP][G] codes (4 * AP bytes per group row: the same bytes as one f32 row).

With G = 2 the conv's weight pairs are widened to i16 once per tile into a stack buffer
so that each step's broadcast is a plain 32-bit load.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ...errors import BackendError
from ...ir.ops.quant import act_bounds
from .emit import F32, i64
from .gemm import (PREFETCH_ROWS, splat, vec_ptr, micro_shape, packed_items, panel_width, prefetch_run,
                   tile_post)
from .loops import alloca_in_entry, for_range
from .target import GENERIC_INT8, DotIsa

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


def _pad64(n: int) -> int:
    return -(-n // 64) * 64


def groups(K: int, isa: DotIsa) -> int:
    return -(-K // isa.group)


def int8_blob(codes_rows: np.ndarray, scale: np.ndarray, packed: bool, vw: int, isa: DotIsa = GENERIC_INT8) -> np.ndarray:
    """codes_rows [C, K] i8, scale [C] f32 -> the weight blob above (u8)."""
    c, k = codes_rows.shape
    g = isa.group
    kp = groups(k, isa) * g
    rows = np.zeros((c, kp), np.int8)
    rows[:, :k] = codes_rows
    wsum = rows.astype(np.int32).sum(axis=1)
    if packed:
        nr = panel_width(vw)
        panels = -(-c // nr)
        cols = np.zeros((panels * nr, kp), np.int8)
        cols[:c] = rows
        # [panels, nr, kg, g] -> [panels, kg, nr, g]
        codes = cols.reshape(panels, nr, kp // g, g).transpose(0, 2, 1, 3)
        cp = panels * nr
        scale = np.concatenate([scale, np.zeros(cp - len(scale), np.float32)])
        wsum = np.concatenate([wsum, np.zeros(cp - len(wsum), np.int32)])
    else:
        codes = rows
    raw = np.ascontiguousarray(codes).tobytes()
    head = raw + b"\0" * (_pad64(len(raw)) - len(raw))
    return np.frombuffer(head + scale.astype("<f4").tobytes() + wsum.astype("<i4").tobytes(), np.uint8)


def bf16_blob(rows: np.ndarray, packed: bool, vw: int) -> np.ndarray:
    """rows [C, 2K] u8 (bf16 bytes, ir/ops/quant.bf16_encode) -> the G = 2 code layout
    above as u8: panels [Kg][NR][2] (packed, a matmul's B) or rows [C][Kg * 2] (a conv),
    K padded with zeros to even. No scales."""
    bits = np.ascontiguousarray(rows).view("<u2")
    c, k = bits.shape
    kp = -(-k // 2) * 2
    out = np.zeros((c, kp), "<u2")
    out[:, :k] = bits
    if packed:
        nr = panel_width(vw)
        panels = -(-c // nr)
        cols = np.zeros((panels * nr, kp), "<u2")
        cols[:c] = out
        out = cols.reshape(panels, nr, kp // 2, 2).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(out).view(np.uint8).reshape(-1)


def blob_parts(b, blob, code_bytes: int, channels: int):
    """(codes i8*, wscale f32*, wsum i32*) inside a weight blob (i8*)."""
    off = _pad64(code_bytes)
    scale = b.bitcast(b.gep(blob, [i64(off)], inbounds=True), F32.as_pointer())
    wsum = b.bitcast(b.gep(blob, [i64(off + 4 * channels)], inbounds=True), I32.as_pointer())
    return blob, scale, wsum


# -- quantization --------------------------------------------------------------------------
def _fcall(b, name, args):
    """A float intrinsic (llvm.rint, llvm.maxnum, ...) on f32 or <n x f32> operands."""
    ty = args[0].type
    full = f"{name}.v{ty.count}f32" if isinstance(ty, ir.VectorType) else f"{name}.f32"
    fn = b.module.globals.get(full) or ir.Function(b.module, ir.FunctionType(ty, [ty] * len(args)), name=full)
    return b.call(fn, list(args))


def _quantize(b, x, aq):
    """f32 (scalar or vector) -> i32 codes q, as fake_quant rounds them (the clamp is a
    compare and select: NaN inputs have no defined code)."""
    lo, hi = act_bounds(aq)
    ty = x.type

    def c(v):
        return ir.Constant(ty, [v] * ty.count) if isinstance(ty, ir.VectorType) else ir.Constant(ty, v)
    inv = float(np.float32(1.0 / aq["scale"]))
    q = b.fadd(_fcall(b, "llvm.rint", [b.fmul(x, c(inv))]), c(float(aq["zero_point"])))
    q = b.select(b.fcmp_ordered("<", q, c(float(lo))), c(float(lo)), q)
    q = b.select(b.fcmp_ordered(">", q, c(float(hi))), c(float(hi)), q)
    ity = ir.VectorType(I32, ty.count) if isinstance(ty, ir.VectorType) else I32
    return b.fptosi(q, ity)


def code_offset(aq, isa: DotIsa) -> int:
    """What is subtracted from q before it is stored: zp (G = 2) or off (G = 4)."""
    if isa.group == 2:
        return int(aq["zero_point"])
    if isa.signed:
        return 128 if aq["dtype"] == "u8" else 0
    return 0 if aq["dtype"] == "u8" else -128


def code_type(isa: DotIsa):
    return I16 if isa.group == 2 else I8


class _BFloat(ir.Type):
    """LLVM's bfloat (llvmlite has no such type; only printed into the IR text)."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash("bfloat")


BFLOAT = _BFloat()


def _bf16_bits(b, x, isa):
    """f32 (scalar or vector) -> i16 bits of bfloat16, rounded to nearest even (NaN to a
    quiet NaN): `vcvtneps2bf16` (AVX-512-BF16)."""
    vec = isinstance(x.type, ir.VectorType)
    n = x.type.count if vec else 1
    if isa.dot != "dpbf16ps":
        raise BackendError(f"bf16 codes need the dpbf16ps isa, not {isa.dot}")
    h = b.fptrunc(x, ir.VectorType(BFLOAT, n) if vec else BFLOAT)
    return b.bitcast(h, ir.VectorType(I16, n) if vec else I16)


def bf16_codes2(b, lo, hi):
    """The bf16 codes (i16, rounded to nearest even) of two f32 vectors, lo's then hi's,
    by one instruction (`vcvtne2ps2bf16`; two `vcvtneps2bf16` and a join otherwise, as
    LLVM emits for fptrunc)."""
    n = lo.type.count
    fn_name = f"llvm.x86.avx512bf16.cvtne2ps2bf16.{32 * n}"
    fn = b.module.globals.get(fn_name) or ir.Function(
        b.module, ir.FunctionType(ir.VectorType(BFLOAT, 2 * n), [lo.type, hi.type]), name=fn_name)
    return b.bitcast(b.call(fn, [hi, lo]), ir.VectorType(I16, 2 * n))


def _code(b, x, aq, isa):
    """f32 -> the stored code (q - code_offset) as i16 / i8 (u8 bits unless isa.signed);
    bf16 bits for a bf16 isa."""
    if isa.bf16:
        return _bf16_bits(b, x, isa)
    q = _quantize(b, x, aq)
    off = code_offset(aq, isa)
    if off:
        q = b.sub(q, ir.Constant(q.type, off))
    ct = code_type(isa)
    return b.trunc(q, ir.VectorType(ct, q.type.count) if isinstance(q.type, ir.VectorType) else ct)


def _corr(aq, isa: DotIsa) -> int:
    """The multiple of wsum the epilogue adds: sum (q - zp) w = sum u w + corr * wsum."""
    return 0 if isa.group == 2 else code_offset(aq, isa) - int(aq["zero_point"])


def emit_quantize_rows(b, A, a_off, lda, rows, K, Q, aq, isa, vw=8):
    """Q[r][Kg * G] = codes of A[a_off + r * lda + k] for r in [0, rows), zeros past K (Q:
    i16* / i8*); vw values at a time, then a scalar tail."""
    kp = groups(K, isa) * isa.group
    ct, fv = code_type(isa), ir.VectorType(F32, vw)
    with for_range(b, rows, name="qr") as r:
        src = b.add(a_off, b.mul(r, i64(lda)))
        dst = b.mul(r, i64(kp))
        with for_range(b, K // vw, name="qv") as kv:
            k = b.mul(kv, i64(vw))
            x = b.load(vec_ptr(b, A, b.add(src, k), fv), align=4)
            b.store(_code(b, x, aq, isa), vec_ptr(b, Q, b.add(dst, k), ir.VectorType(ct, vw)), align=1)
        for k in range(K // vw * vw, K):
            x = b.load(b.gep(A, [b.add(src, i64(k))], inbounds=True))
            b.store(_code(b, x, aq, isa), b.gep(Q, [b.add(dst, i64(k))], inbounds=True))
        for k in range(K, kp):
            b.store(ir.Constant(ct, 0), b.gep(Q, [b.add(dst, i64(k))], inbounds=True))


def emit_quantize_panel(b, S, panel, K, ap, aq, isa, vw, src=None):
    """Rewrite the f32 panel S[panel] ([K][ap], S: f32*, ap a multiple of vw) in place as
    [Kg][ap][G] codes (emit_quantize_block).
    `src=(X, x_off, ldx)`: the codes of X's rows instead (row k's ap columns from
    x_off + k * ldx, all of them inside X: a 1x1 conv's input planes, no f32 copy)."""
    X, x_off, ldx = (S, b.mul(panel, i64(K * ap)), ap) if src is None else src
    emit_quantize_block(b, X, x_off, ldx, K, panel_codes(b, S, panel, K, ap, isa), ap, ap, aq, isa, vw)


def panel_codes(b, S, panel, K, ap, isa):
    """Where panel `panel`'s codes start: over the f32 panel S[panel] ([K][ap], S: f32*),
    as a code pointer."""
    return b.bitcast(b.gep(S, [b.mul(panel, i64(K * ap))], inbounds=True), code_type(isa).as_pointer())


def emit_quantize_block(b, X, x_off, ldx, K, out, ldo, width, aq, isa, vw, load=None):
    """Codes [Kg][.][G] of the f32 rows X[x_off + k * ldx + j], j < width (a multiple of
    vw), into out (a code pointer; group row kg's positions start at kg * ldo), vw
    columns at a time. In place (out over the bytes of X's rows, ldo = ldx): group row kg
    reads f32 rows kg*G.. (>= kg) and writes the bytes of f32 row kg, each chunk after
    reading it, so disjoint column ranges can run on different threads.
    `load(b, index, c)`: the f32 vector at element index of X, chunk c (default a plain
    load; a masked one keeps a ragged block inside X)."""
    g = isa.group
    fv = ir.VectorType(F32, vw)

    def group(kg, rows):  # rows: how many of the group's G rows are inside K
        for c in range(width // vw):
            xs = []
            for i in range(rows):
                k = b.add(b.mul(kg, i64(g)), i64(i))
                at = b.add(x_off, b.add(b.mul(k, i64(ldx)), i64(c * vw)))
                xs.append(b.load(vec_ptr(b, X, at, fv), align=4) if load is None else load(b, at, c))
            store_group(b, xs, out, b.add(b.mul(kg, i64(ldo)), i64(c * vw)), aq, isa, vw)
    with for_range(b, K // g, name="qg") as kg:
        group(kg, g)
    if K % g:
        group(i64(K // g), K % g)


def group_codes(b, xs, aq, isa, vw):
    """The codes of one group row's vw positions, interleaved ([vw][G], a <vw * G> code
    vector): xs, the f32 vectors of its first len(xs) rows (the rest zeros)."""
    g = isa.group
    fv = ir.VectorType(F32, vw)
    rows = [xs[i] if i < len(xs) else ir.Constant(fv, [0.0] * vw) for i in range(g)]
    # the rows' codes one after the other, then one shuffle interleaves them
    joined = bf16_codes2(b, *rows) if isa.dot == "dpbf16ps" else _concat(b, [_code(b, x, aq, isa) for x in rows])
    mask = ir.Constant(ir.VectorType(I32, vw * g), [i * vw + j for j in range(vw) for i in range(g)])
    return b.shuffle_vector(joined, ir.Constant(joined.type, ir.Undefined), mask)


def store_group(b, xs, out, pos, aq, isa, vw):
    """group_codes of xs at position pos (i64) of out."""
    ct, g = code_type(isa), isa.group
    b.store(group_codes(b, xs, aq, isa, vw), vec_ptr(b, out, b.mul(pos, i64(g)), ir.VectorType(ct, vw * g)), align=1)


# -- the dot product ------------------------------------------------------------------------
def _intrinsic(b, name, ret, args):
    fn = b.module.globals.get(name) or ir.Function(b.module, ir.FunctionType(ret, [a.type for a in args]),
                                                   name=name)
    return b.call(fn, list(args))


def _lanes_sum(b, p, vw, g):
    """<vw*g x i32> -> <vw x i32>: lane j = sum of p[j*g .. j*g+g-1]."""
    undef = ir.Constant(p.type, ir.Undefined)
    idx = lambda i: ir.Constant(ir.VectorType(I32, vw), [j * g + i for j in range(vw)])  # noqa: E731
    parts = [b.shuffle_vector(p, undef, idx(i)) for i in range(g)]
    out = parts[0]
    for q in parts[1:]:
        out = b.add(out, q)
    return out


def _lanes(b, v, start: int, n: int):
    """Elements [start, start + n) of vector v (v itself when that is all of it)."""
    if start == 0 and v.type.count == n:
        return v
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, n), list(range(start, start + n))))


def _concat(b, parts):
    """Equal-length vectors joined in order (a power-of-two count)."""
    while len(parts) > 1:
        parts = [b.shuffle_vector(parts[j], parts[j + 1], ir.Constant(
            ir.VectorType(I32, 2 * parts[j].type.count), list(range(2 * parts[j].type.count))))
            for j in range(0, len(parts), 2)]
    return parts[0]


def _dot(b, isa, acc, act, wt, vw):
    """acc (<vw x i32>) + per lane the dot product of G activation codes (act) and G
    weight codes (wt); act/wt: <vw*G x i16> (G = 2) or <vw*G x i8> (G = 4, act as u8)."""
    vty = ir.VectorType(I32, vw)
    if isa.dot == "pmaddwd":
        name = {4: "llvm.x86.sse2.pmadd.wd", 8: "llvm.x86.avx2.pmadd.wd", 16: "llvm.x86.avx512.pmaddw.d.512"}[vw]
        return b.add(acc, _intrinsic(b, name, vty, [act, wt]))
    if isa.dot == "vpdpbusd":
        return _intrinsic(b, f"llvm.x86.avx512.vpdpbusd.{32 * vw}", vty, [acc, act, wt])
    if isa.bf16:
        return _dot_bf16(b, isa, acc, act, wt, vw)
    if isa.dot == "sdot":  # 128-bit steps: 4 i32 lanes of 4 products each
        parts = [_intrinsic(b, "llvm.aarch64.neon.sdot.v4i32.v16i8", ir.VectorType(I32, 4),
                            [_lanes(b, acc, h, 4), _lanes(b, act, 4 * h, 16), _lanes(b, wt, 4 * h, 16)])
                 for h in range(0, vw, 4)]
        return parts[0] if vw == 4 else _concat(b, parts)
    wide = ir.VectorType(I32, vw * isa.group)
    a32 = b.sext(act, wide) if isa.group == 2 or isa.signed else b.zext(act, wide)
    return b.add(acc, _lanes_sum(b, b.mul(a32, b.sext(wt, wide)), vw, isa.group))


def _dot_bf16(b, isa, acc, act, wt, vw):
    """acc (<vw x f32>) + per lane a0 * w0 + a1 * w1 of the bf16 pairs act / wt (<2vw x i16>)."""
    if isa.dot != "dpbf16ps":
        raise BackendError(f"the bf16 pair dot product needs the dpbf16ps isa, not {isa.dot}")
    bty = ir.VectorType(BFLOAT, 2 * vw)
    return _intrinsic(b, f"llvm.x86.avx512bf16.dpbf16ps.{32 * vw}", ir.VectorType(F32, vw),
                      [acc, b.bitcast(act, bty), b.bitcast(wt, bty)])


def _group_vec(b, ptr, index, vw, isa, ty):
    """The vector <vw*G x ty> at element index of ptr (ty*)."""
    return b.load(vec_ptr(b, ptr, index, ir.VectorType(ty, vw * isa.group)), align=1)


def _bcast(b, ptr32, index, vw, isa):
    """One group (an i32 at index of ptr32) splatted to <vw*G x i16 / i8>."""
    s = splat(b, b.load(b.gep(ptr32, [index], inbounds=True), align=1), ir.VectorType(I32, vw))
    return b.bitcast(s, ir.VectorType(code_type(isa), vw * isa.group))


def _tile(b, kg_n, mr, nv, vw, isa, operands, rescale, C, c_row0, ldc, c_j0, valid, post=None, store=None,
          taps: int = 1):
    """i32 accumulation over Kg groups (operands(kg) -> (mr activation-or-weight
    broadcasts, nv vectors, which side is the activation)), then rescale(acc, r, v) ->
    <vw x f32> stored into C. bf16 accumulates in f32 (rescale: None). `post(b, r, col,
    vec)` maps each whole f32 vector (tile row r, C column col) before it is stored.
    `store(b, vals)` takes the f32 vectors instead (vals[r][v], the vectors that hold
    valid columns) and stores them itself. `taps` > 1 (dividing kg_n): the groups run as
    kg_n / taps rounds of `taps` unrolled ones, operands((round, tap)) for each."""
    vty = ir.VectorType(F32 if isa.bf16 else I32, vw)
    accs = [[alloca_in_entry(b, vty) for _ in range(nv)] for _ in range(mr)]
    for row in accs:
        for a in row:
            b.store(ir.Constant(vty, [0.0 if isa.bf16 else 0] * vw), a)

    def step(kg):
        av, bv, act_is_a = operands(kg)
        for r in range(mr):
            for v in range(nv):
                act, wt = (av[r], bv[v]) if act_is_a else (bv[v], av[r])
                b.store(_dot(b, isa, b.load(accs[r][v]), act, wt, vw), accs[r][v])
    with for_range(b, kg_n // taps, name="kg") as kg:
        if taps == 1:
            step(kg)
        else:
            for t in range(taps):
                step((kg, t))
    fty = ir.VectorType(F32, vw)
    full = nv * vw if valid is None else (valid // vw) * vw
    if store is not None:
        held = -(-(nv * vw if valid is None else valid) // vw)
        store(b, [[b.load(accs[r][v]) if rescale is None else rescale(b.load(accs[r][v]), r, v)
                   for v in range(held)] for r in range(mr)])
        return
    for r in range(mr):
        crow = b.add(b.add(c_row0, i64(r * ldc)), c_j0)
        for v in range(-(-(nv * vw if valid is None else valid) // vw)):
            out = b.load(accs[r][v]) if rescale is None else rescale(b.load(accs[r][v]), r, v)
            if post is not None and v < full // vw:
                out = post(b, r, b.add(c_j0, i64(v * vw)), out)
            if v < full // vw:
                b.store(out, vec_ptr(b, C, b.add(crow, i64(v * vw)), fty), align=4)
            else:  # the ragged end of the last panel
                for j in range(valid - full):
                    x = b.extract_element(out, ir.Constant(I32, j))
                    b.store(x, b.gep(C, [b.add(crow, i64(full + j))], inbounds=True))


def _fixed(b, acc, ws, corr, vty):
    return b.add(acc, b.mul(ws, ir.Constant(vty, [corr] * vty.count))) if corr else acc


@dataclass(frozen=True)
class Gather:
    """Where emit_i8b_gemm's A groups lie when no matrix holds them: group (row m, kg =
    round * len(taps) + t) is the i32 at A32[row_at(b, m) + round * pitch + taps[t]] (a
    transposed bf16 conv reading its padded copy of plane pairs: a round per pair, one
    group per tap)."""
    A32: object
    row_at: object
    pitch: int
    taps: tuple


def emit_i8b_gemm(b, Q, A, lda, blob, C, ldc, M, N, K, vw, aq, isa, epilogue, items, q_pitch=None, store=None,
                  gather: Gather | None = None):
    """C = A @ W: W int8 [K, N] in panels (int8_blob, packed; bf16_blob for a bf16 isa). Q: the codes of all of A
    ([M][Kg][G], emit_quantize_rows), or None: each tile quantizes its own rows of A
    (f32 [M, K], row stride lda) into a stack buffer first (a runtime M, no scratch).
    `q_pitch`: Q is [Kg][q_pitch][G] instead (group row kg's rows of A q_pitch positions
    apart: a transposed conv's im2col^T codes, emit_quantize_block).
    `store(b, row0, rows, col0, valid, vals)`: each finished tile's f32 vectors
    (vals[r][v]: row row0 + r, columns from col0 + v * vw; `valid` columns in all, None
    for a whole panel) go there instead of into C (no epilogue then).
    `gather`: the groups of A are read where it says (Q and A unused)."""
    mr_full, nv = micro_shape(vw)
    nr = nv * vw
    cp = -(-N // nr) * nr
    kg_n, g = groups(K, isa), isa.group
    codes, wscale, wsum = blob_parts(b, blob, kg_n * g * cp, cp)
    if isa.bf16:  # i16 bits, no scales
        codes = b.bitcast(blob, I16.as_pointer())
    ity, fty = ir.VectorType(I32, vw), ir.VectorType(F32, vw)
    own = Q is None and gather is None
    if own:
        Q = b.bitcast(alloca_in_entry(b, ir.ArrayType(code_type(isa), mr_full * kg_n * g)),
                      code_type(isa).as_pointer())
    q32 = None if Q is None else b.bitcast(Q, I32.as_pointer())
    s, corr = float(np.float32(aq.get("scale", 1.0))), _corr(aq, isa)

    def tile(row0, mr, p, valid):
        j0 = b.mul(p, i64(nr))
        panel = b.mul(p, i64(kg_n * nr * g))
        # group (row r, kg) of the codes at arow + r * r_step + kg * kg_step (i32 units)
        r_step, kg_step = (kg_n, 1) if q_pitch is None else (1, q_pitch)
        if gather is not None:
            row_base = [gather.row_at(b, b.add(row0, i64(r))) for r in range(mr)]
        elif own:
            emit_quantize_rows(b, A, b.mul(row0, i64(lda)), lda, mr, K, Q, aq, isa, vw)
            arow = i64(0)
        else:
            arow = b.mul(row0, i64(r_step))

        def operands(kg):
            if gather is not None:
                rnd, t = kg
                at = b.add(b.mul(rnd, i64(gather.pitch)), i64(gather.taps[t]))
                kg = b.add(b.mul(rnd, i64(len(gather.taps))), i64(t))
            brow = b.add(panel, b.mul(kg, i64(nr * g)))
            bv = [_group_vec(b, codes, b.add(brow, i64(v * vw * g)), vw, isa, I16 if isa.bf16 else I8)
                  for v in range(nv)]
            if mr >= PREFETCH_ROWS:  # this group row of the next panel
                prefetch_run(b, codes, b.add(brow, i64(kg_n * nr * g)), nr * g, 2 if isa.bf16 else 1)
            if g == 2 and not isa.bf16:
                bv = [b.sext(x, ir.VectorType(I16, vw * g)) for x in bv]
            if gather is not None:
                return [_bcast(b, gather.A32, b.add(row_base[r], at), vw, isa) for r in range(mr)], bv, True
            kg_at = kg if kg_step == 1 else b.mul(kg, i64(kg_step))
            av = [_bcast(b, q32, b.add(b.add(arow, i64(r * r_step)), kg_at), vw, isa) for r in range(mr)]
            return av, bv, True

        def rescale(acc, r, v):
            col = b.add(j0, i64(v * vw))
            ws = b.load(vec_ptr(b, wsum, col, ity), align=4)
            sc = b.fmul(b.load(vec_ptr(b, wscale, col, fty), align=4), ir.Constant(fty, [s] * vw))
            return b.fmul(b.sitofp(_fixed(b, acc, ws, corr, ity), fty), sc)
        post, after = tile_post(epilogue, row0, valid, vw)
        own_store = None if store is None else (lambda bb, vals: store(bb, row0, mr, j0, valid, vals))
        _tile(b, kg_n, mr, nv, vw, isa, operands, None if isa.bf16 else rescale, C, b.mul(row0, i64(ldc)), ldc,
              j0, valid, post, own_store, 1 if gather is None else len(gather.taps))
        if after and store is None:
            epilogue(b, row0, mr, j0, nr if valid is None else valid)
    packed_items(b, M, N, vw, items, tile)


def emit_i8a_gemm(b, blob, a_row_off, rows_total, Sq, C, c_off, ldc, M, N, K, vw, aq, isa, epilogue, items,
                  panel_at=None, store=None, planes=None):
    """C = W @ B: W int8 rows [rows_total][Kg * G] (int8_blob or bf16_blob; rows from a_row_off, an
    i64), B the activation codes in panels ([Kg][AP][G] per panel, emit_quantize_panel;
    Sq: i8*, panel stride K * AP * 4 bytes). `panel_at` (i64): every panel is read from
    that panel slot of Sq (one panel). `store(b, row0, rows, col0, valid, vals)`: each
    finished tile's f32 vectors go there instead of into C (emit_i8b_gemm's).
    `planes=(X, x_off, ld)`: whole panels are read where they lie, group row kg of panel
    p at group x_off + kg * ld + p * AP of X (a code pointer: a 1x1 conv's input stored
    as plane pairs of codes), only a ragged last one from Sq."""
    mr_full, nv = micro_shape(vw)
    nr = nv * vw
    kg_n, g = groups(K, isa), isa.group
    codes, wscale, wsum = blob_parts(b, blob, rows_total * kg_n * g, rows_total)
    ity, fty = ir.VectorType(I32, vw), ir.VectorType(F32, vw)
    ct = code_type(isa)
    S = b.bitcast(Sq, ct.as_pointer())
    s, corr = float(np.float32(aq.get("scale", 1.0))), _corr(aq, isa)
    if g == 2 and not isa.bf16:  # the tile's weight rows, widened to i16 pairs
        wide = b.bitcast(alloca_in_entry(b, ir.ArrayType(I16, mr_full * kg_n * g)), I16.as_pointer())
        w32 = b.bitcast(wide, I32.as_pointer())
    else:
        w32 = b.bitcast(codes, I32.as_pointer())

    def tile(row0, mr, p, valid):
        rows = b.add(a_row_off, row0)
        panel = b.mul(p if panel_at is None else panel_at, i64(K * nr * 4 // (ct.width // 8)))  # K*AP*4 bytes
        if g == 2 and not isa.bf16:
            src0 = b.mul(rows, i64(kg_n * g))
            with for_range(b, mr * kg_n * g, name="wx") as e:
                w = b.load(b.gep(codes, [b.add(src0, e)], inbounds=True))
                b.store(b.sext(w, I16), b.gep(wide, [e], inbounds=True))
            wrow0 = i64(0)
        else:
            wrow0 = b.mul(rows, i64(kg_n))

        src, ld = S, nr  # the codes' pointer and positions per group row
        if planes is not None and valid is None:
            src, x_off, ld = planes
            panel = b.mul(b.add(x_off, b.mul(p, i64(nr))), i64(g))

        def operands(kg):
            brow = b.add(panel, b.mul(kg, i64(ld * g)))
            bv = [_group_vec(b, src, b.add(brow, i64(v * vw * g)), vw, isa, ct) for v in range(nv)]
            av = [_bcast(b, w32, b.add(b.add(wrow0, i64(r * kg_n)), kg), vw, isa) for r in range(mr)]
            return av, bv, False

        def rescale(acc, r, v):
            row = b.add(rows, i64(r))
            ws = splat(b, b.load(b.gep(wsum, [row], inbounds=True)), ity)
            sc = splat(b, b.fmul(b.load(b.gep(wscale, [row], inbounds=True)), ir.Constant(F32, s)), fty)
            return b.fmul(b.sitofp(_fixed(b, acc, ws, corr, ity), fty), sc)
        post, after = tile_post(epilogue, row0, valid, vw)
        own_store = None if store is None else (lambda bb, vals: store(bb, row0, mr, b.mul(p, i64(nr)), valid, vals))
        _tile(b, kg_n, mr, nv, vw, isa, operands, None if isa.bf16 else rescale, C,
              b.add(c_off, b.mul(row0, i64(ldc))), ldc,
              b.mul(p, i64(nr)), valid, post, own_store)
        if after and store is None:
            epilogue(b, row0, mr, b.mul(p, i64(nr)), nr if valid is None else valid)
    packed_items(b, M, N, vw, items, tile)
