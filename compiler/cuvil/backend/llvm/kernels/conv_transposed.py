"""Transposed convs, C^T[P, OC] = im2col^T @ W^T (the plan's "transposed" form, for output
planes that fill column panels poorly): the GEMM into C^T, the transpose back into NCHW
with the epilogue, or the tiles stored transposed from registers (transposed_store).
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ....errors import BackendError
from ..emit import F32, i64
from ..gemm import emit_gemm_panel, panel_width
from ..kernel_args import KernelArgs
from ..loops import for_range
from ..parallel import parallel
from ..target import masked_lanes
from ..vectors import index_div, store_lanes, vector_transpose
from .bf16_codes import concat_codes, pair_codes
from .conv_shapes import conv_geometry, conv_scratch, padded_input
from .epilogue import pairs_epilogue, row_epilogue, whole_epilogue
from .im2col import im2col_panel, padded_copy


@dataclass(frozen=True)
class Transposed:
    """A transposed conv's layout (k_conv2d_transposed, bf16.k_conv2d_bf16_transposed):
    P output positions per plane, K = kdim, im2col^T's columns in `panels` panels of nr,
    C^T[P, OC] in the scratch from element ct_at with rows of ldct (OC rounded up to
    whole panels)."""
    pointwise: bool
    p: int
    kdim: int
    nr: int
    panels: int
    ldct: int
    ct_at: int

    @classmethod
    def of(cls, k: KernelArgs, codes: bool = False) -> "Transposed":
        xt, wt = k.in_types[:2]
        oc, icg, kh, kw = wt.shape
        p, nr = k.out_type.shape[2] * k.out_type.shape[3], panel_width(k.vw)
        return cls(conv_geometry(xt, wt, k.out_type, k.attrs)[0], p, icg * kh * kw, nr, -(-p // nr),
                   -(-oc // nr) * nr, conv_scratch(xt, wt, k.out_type, k.attrs, True, codes)[0])


def run_transposed(b, k: KernelArgs, t: Transposed, prepare, gemm, direct: bool = False, pairs=None):
    """A transposed conv's steps per image, each a parallel loop whose body gets the
    extras [xplane0, ni]: the padded input copy where the conv has one, `prepare` =
    (count, body) building im2col^T (None: the GEMM reads the input), `gemm` = (count,
    body) into C^T, then C^T transposed into the NCHW result vw x vw blocks at a time,
    each channel block taking the epilogue while it is in cache (not with `direct`:
    the GEMM stored the result itself). An epilogue that cannot run per channel block
    runs on the whole result after. `pairs`: the padded copy's (padded_copy)."""
    xt, wt = k.in_types[:2]
    n, c, h, w = xt.shape
    oc, vw = wt.shape[0], k.vw
    epi_all = row_epilogue(k, 2, 2)
    row_epi = epi_all is not None and epi_all.supports_cols

    def transpose(b, k2, i, ex):
        Ct = b.gep(b.bitcast(k2.scratch, F32.as_pointer()), [i64(t.ct_at)], inbounds=True)
        transpose_channels(b, k2, Ct, t.ldct, b.mul(i, i64(vw)), ex[1], t.p, oc,
                            row_epilogue(k2, 2, 2) if row_epi else None)

    with for_range(b, n, name="n") as ni:
        extras = [b.mul(ni, i64(c * h * w)), ni]
        if padded_input(xt, wt, k.out_type, k.attrs) is not None:
            padded_copy(b, k, extras[0], pairs=pairs)
        for step in (prepare, gemm):
            if step is not None:
                parallel(b, k, step[0], step[1], extras)
        if not direct:
            parallel(b, k, -(-oc // vw), transpose, extras)
    if epi_all is not None and not row_epi:
        whole_epilogue(b, k, 2)


def k_conv2d_transposed(b, k: KernelArgs):
    """A conv_transposed convolution (run_transposed): im2col^T (K rows of P, padded to
    whole panels; a 1x1 conv's input planes already are that) times the packed W^T
    gives C^T[P, OC] in scratch. A 1x1 one on masked vectors whose epilogue, if any,
    runs on vectors and whose channels fill whole panels stores its tiles transposed in
    registers instead (transposed_store: no C^T, no transpose pass; 1x1 ones only: the
    K-blocked 3x3 ones at 7x7 did not gain from it)."""
    icg = k.in_types[1].shape[1]
    t = Transposed.of(k)
    ldk = t.p if t.pointwise else t.panels * t.nr

    def scratch(b, k2):
        return b.bitcast(k2.scratch, F32.as_pointer())

    def pack(b, k2, i, ex):
        im2col_panel(b, k2, scratch(b, k2), ex[0], b.sdiv(i, i64(icg)), (t.nr, ldk), b.srem(i, i64(icg)))

    epi_all = row_epilogue(k, 2, 2)
    direct = t.pointwise and masked_lanes(k.vw) and (epi_all is None or epi_all.apply is not None) \
        and k.out_type.shape[1] % t.nr == 0

    def gemm_panel(b, k2, i, ex):
        A, a_off = (k2.ins[0], ex[0]) if t.pointwise else (scratch(b, k2), i64(0))
        Ct = b.gep(scratch(b, k2), [i64(t.ct_at)], inbounds=True)
        emit_gemm_panel(b, A, a_off, 1, ldk, k2.ins[1], Ct, t.ldct, t.p, t.kdim, k2.vw, F32, i,
                        store=transposed_store(b, k2, ex[1]) if direct else None)

    run_transposed(b, k, t, None if t.pointwise else (t.panels * icg, pack), (t.ldct // t.nr, gemm_panel), direct)


def transposed_store(b, k2: KernelArgs, ni, pairs=None):
    """For a transposed conv whose epilogue is absent or runs on vectors (`apply`; its
    extra operands read in the tile's pixels only): a GEMM tile
    store(b, row0, rows, col0, valid, vals) that writes the tile's vectors (vals[r][v]:
    pixel row0 + r, channels from col0 + v * vw) transposed in registers straight into
    image ni's NCHW result, each channel's rows pixels (rows <= vw) in one masked store,
    after the epilogue. `valid`: the channels of a ragged last panel (None: a whole one).
    `pairs` (a bf16 DotIsa; `out_pairs`, whose epilogue, if any, runs on vectors):
    the result is plane pairs of codes. An epilogue in registers (one value per channel)
    runs on the tile as it is (apply_rows: a vector of a bias's channels), each pixel's
    two vectors become the codes of its 2 * vw channels (bf16_codes.concat_codes: pair j in
    element j) and one transpose gives every pair's pixels (half the transposes of
    transposing both vectors first and making the pairs' codes after); one over pixels
    (a residual) needs each channel's pixels: the tile's
    vectors are transposed first, then two channels' vectors become a pair's codes.
    Used by the bf16 transposed convs (bf16.py) and the f32 1x1 ones
    (k_conv2d_transposed)."""
    oc, p, vw = k2.out_type.shape[1], k2.out_type.shape[2] * k2.out_type.shape[3], k2.vw
    fv = ir.VectorType(F32, vw)
    epi = row_epilogue(k2, 2, 2) if pairs is None else pairs_epilogue(k2)
    zero = ir.Constant(fv, [0.0] * vw)

    def pair_store(b, row0, rows, col0, valid, vals):
        # the tile as it is (a pixel's channels per vector) takes the epilogue, two
        # vectors of a pixel become the codes of 2 * vw channels (vw pairs, in order),
        # and one transpose of those gives each pair's pixels
        nv = len(vals[0])
        for v in range(0, nv, 2):
            ch0 = b.add(b.mul(ni, i64(oc)), b.add(col0, i64(v * vw)))
            real = [vw if valid is None else max(0, min(vw, valid - (v + h) * vw)) for h in (0, 1)]
            codes = []
            for r in range(rows):
                two = []
                for h in (0, 1):
                    x = vals[r][v + h] if v + h < nv else zero
                    if epi is not None and real[h]:
                        x = epi.apply_rows(b, b.add(ch0, i64(h * vw)), x, real[h])
                    two.append(x)
                codes.append(concat_codes(b, two[0], two[1], pairs))
            lanes = vector_transpose(b, codes + [zero] * (vw - rows))
            for j, vec in enumerate(lanes):  # pair j: channels 2j, 2j + 1 from ch0
                if 2 * j >= real[0] + real[1]:
                    break
                at = b.add(b.mul(b.add(index_div(b, ch0, 2), i64(j)), i64(p)), row0)
                store_lanes(b, vec, b.bitcast(b.gep(k2.out, [at], inbounds=True), fv.as_pointer()), rows)

    if pairs is not None and epi is not None and epi.apply is None:
        raise BackendError("a transposed conv stores plane pairs only with an epilogue on vectors (writes_pairs)")

    def store(b, row0, rows, col0, valid, vals):
        if pairs is not None and (epi is None or epi.in_registers):
            return pair_store(b, row0, rows, col0, valid, vals)
        # by channel: each vector of the tile transposed, each channel's pixels take the
        # epilogue (an even channel count where a pairs operand is read: channel parity
        # j % 2); with `pairs` (an epilogue over pixels, a residual) channels 2i and
        # 2i + 1 then become pair i's codes
        step = 1 if pairs is None else 2
        for v in range(len(vals[0])):
            lanes = vector_transpose(b, [vals[r][v] for r in range(rows)] + [zero] * (vw - rows))
            for j in range(0, vw, step):  # channels col0 + v * vw + j (and the next): pixels row0 ..
                if valid is not None and v * vw + j >= valid:
                    break
                ch = b.add(b.mul(ni, i64(oc)), b.add(col0, i64(v * vw + j)))
                got = [lanes[j + h] if epi is None else epi.apply(b, b.add(ch, i64(h)), row0, lanes[j + h], rows,
                                                                  (j + h) % 2) for h in range(step)]
                vec = got[0] if pairs is None else pair_codes(b, got[0], got[1], pairs)
                at = b.mul(ch, i64(p)) if pairs is None else b.mul(index_div(b, ch, 2), i64(p))
                store_lanes(b, vec, b.bitcast(b.gep(k2.out, [b.add(at, row0)], inbounds=True), fv.as_pointer()),
                             rows)
    return store


def transpose_channels(b, k2: KernelArgs, Ct, ldct, oc0, ni, p, oc, epi):
    """Channels [oc0, oc0 + vw) of image ni from C^T[P, OC] (row stride ldct; rows past
    P may be read, their lanes are not stored) into the NCHW result, then the epilogue
    on them. A last block of fewer than vw channels goes element by element."""
    vw = k2.vw
    vty = ir.VectorType(F32, vw)
    plane0 = b.mul(b.add(b.mul(ni, i64(oc)), oc0), i64(p))

    def block(p0, count):
        rows = [b.load(b.bitcast(b.gep(Ct, [b.add(b.mul(b.add(p0, i64(i)), i64(ldct)), oc0)], inbounds=True),
                                 vty.as_pointer()), align=4) for i in range(vw)]
        for lane, vec in enumerate(vector_transpose(b, rows)):
            dst = b.add(b.add(plane0, i64(lane * p)), p0)
            if count == vw:
                b.store(vec, b.bitcast(b.gep(k2.out, [dst], inbounds=True), vty.as_pointer()), align=4)
            else:
                for j in range(count):
                    b.store(b.extract_element(vec, ir.Constant(ir.IntType(32), j)),
                            b.gep(k2.out, [b.add(dst, i64(j))], inbounds=True))

    full = b.icmp_signed("<=", b.add(oc0, i64(vw)), i64(oc))
    with b.if_else(full) as (then, otherwise):
        with then:
            with for_range(b, p // vw, name="pb") as pb:
                block(b.mul(pb, i64(vw)), vw)
            if p % vw:
                block(i64(p // vw * vw), p % vw)
            if epi is not None:
                epi(b, b.add(b.mul(ni, i64(oc)), oc0), vw, i64(0), p)
        with otherwise:
            if oc % vw:
                with for_range(b, oc % vw, name="ch") as ch:
                    with for_range(b, p, name="pe") as pe:
                        v = b.load(b.gep(Ct, [b.add(b.mul(pe, i64(ldct)), b.add(oc0, ch))], inbounds=True))
                        b.store(v, b.gep(k2.out, [b.add(b.add(plane0, b.mul(ch, i64(p))), pe)], inbounds=True))
                if epi is not None:
                    epi(b, b.add(b.mul(ni, i64(oc)), oc0), oc % vw, i64(0), p)
