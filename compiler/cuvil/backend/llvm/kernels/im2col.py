"""What a GEMM conv packs its B panels from: im2col panels straight from the input (with
bounds checks), or from a zero-padded, phase-split copy of the input planes made once
per call across the threads (padded_copy; plain vector loads, no checks).
"""
from __future__ import annotations

from llvmlite import ir

from ....errors import BackendError
from ..emit import F32, I64, fconst, i64, load, store
from ..gemm import panel_width, splat
from ..kernel_args import KernelArgs
from ..loops import for_range
from ..parallel import parallel
from ..target import masked_lanes
from ..vectors import imax, imin, load_lanes, store_lanes
from .conv_shapes import PANEL_PAD, im2col_bytes, padded_column, padded_input, range_for_tap


def im2col_packed(b, X, xplane0, S, icg, h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl, dt, nr, panel,
                   pitches=None, ic=None):
    """Panel `panel` (i64) of the packed im2col matrix: S[panel][r][j] for r over
    (ic, ky, kx) and j < nr, = X[ic, y*sh - pt + ky*dh, x*sw - pl + kx*dw] at column
    panel*nr + j = y*ow + x, or 0 outside the image or past the last column.
    `pitches=(panel, row)`: S's element strides (default kdim*nr, nr); `ic` (i64): only
    that input channel's rows.

    Per (r, output row y) the panel's columns are one run of x; the run splits into a
    zero head, a strided copy of one input row and a zero tail, so the inner loops are
    plain copies and fills."""
    zero = fconst(dt, 0.0)
    kdim, p = icg * kh * kw, oh * ow
    c0 = b.mul(panel, i64(nr))
    c1 = imin(b, b.add(c0, i64(nr)), i64(p))
    y_first, y_last = b.sdiv(c0, i64(ow)), b.sdiv(b.sub(c1, i64(1)), i64(ow))
    panel_pitch, row_pitch = pitches or (kdim * nr, nr)
    r_lo = i64(0) if ic is None else b.mul(ic, i64(kh * kw))
    r_hi = i64(kdim) if ic is None else b.add(r_lo, i64(kh * kw))
    with for_range(b, r_hi, start=r_lo, name="r") as r:
        ic = b.sdiv(r, i64(kh * kw))
        ky = b.srem(b.sdiv(r, i64(kw)), i64(kh))
        kx = b.srem(r, i64(kw))
        toff_h = b.sub(b.mul(ky, i64(dh)), i64(pt))
        toff_w = b.sub(b.mul(kx, i64(dw)), i64(pl))
        ox_lo, ox_hi = range_for_tap(b, toff_w, sw, w, ow)
        xplane = b.add(xplane0, b.mul(ic, i64(h * w)))
        dst = b.sub(b.add(b.mul(panel, i64(panel_pitch)), b.mul(r, i64(row_pitch))), c0)  # + column
        with for_range(b, b.add(y_last, i64(1)), start=y_first, name="y") as y:
            s0 = imax(b, c0, b.mul(y, i64(ow)))                 # columns of row y in the panel
            s1 = imin(b, c1, b.mul(b.add(y, i64(1)), i64(ow)))
            iy = b.add(b.mul(y, i64(sh)), toff_h)
            row_ok = b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(h)))
            base = b.mul(y, i64(ow))
            a0 = b.select(row_ok, imin(b, imax(b, s0, b.add(base, ox_lo)), s1), s1)  # copy range [a0, a1)
            a1 = b.select(row_ok, imax(b, a0, imin(b, s1, b.add(base, ox_hi))), s1)
            with for_range(b, a0, start=s0, name="zh") as cc:
                store(b, zero, S, b.add(dst, cc), dt)
            src = b.add(b.add(xplane, b.mul(b.select(row_ok, iy, i64(0)), i64(w))), toff_w)
            with for_range(b, a1, start=a0, name="cp") as cc:
                x = b.sub(cc, base)
                store(b, load(b, X, b.add(src, b.mul(x, i64(sw))), dt), S, b.add(dst, cc), dt)
            with for_range(b, s1, start=a1, name="zt") as cc:
                store(b, zero, S, b.add(dst, cc), dt)
        with for_range(b, b.add(c0, i64(nr)), start=c1, name="zp") as cc:  # padding past the last column
            store(b, zero, S, b.add(dst, cc), dt)

# Work items of the padded input copy: at least this many, whole planes where there are
# enough of them, else bands of rows (a stem's 3 planes would leave one of 2 threads idle
# for a third of the copy).
PADDED_COPY_ITEMS = 8


def padded_copy(b, k: KernelArgs, xplane0, rnd=None, pairs=None):
    """The zero-padded, phase-split copy (padded_input) of the conv's input planes from
    element xplane0 (one image or group), across the threads; `rnd(b, value)` maps each
    copied value. `pairs(b, v0, v1)` (masked vectors only): the copy holds one plane per
    pair of input planes (2i, 2i + 1), each element the 32 bits that function makes of
    the two planes' vectors (a bf16 conv's codes of both, bf16_codes.pair_codes); where
    the input is such pairs already (`in_pairs`: xplane0 still counts f32 planes), the
    copy is of them as they are."""
    icg = k.in_types[1].shape[1]
    planes = icg // 2 if pairs else icg
    hp = padded_input(*k.in_types[:2], k.out_type, k.attrs)[0]
    bands = min(hp, -(-PADDED_COPY_ITEMS // planes))

    def item(b, k2, t, ex):
        band = b.srem(t, i64(bands))
        y0 = b.sdiv(b.mul(band, i64(hp)), i64(bands))
        y1 = b.sdiv(b.mul(b.add(band, i64(1)), i64(hp)), i64(bands))
        padded_copy_rows(b, k2, b.sdiv(t, i64(bands)), ex[0], (y0, y1), rnd, pairs)
    parallel(b, k, planes * bands, item, [xplane0])


def padded_copy_rows(b, k2: KernelArgs, ic, xplane0, rows, rnd=None, pairs=None):
    """Rows [y0, y1) (`rows`, i64 values) of plane ic's padded copy (with `pairs`, of
    pair ic's). With masked vectors (x86), sw * vw consecutive input columns at a time:
    one masked load (the lanes in the padding read as zeros), split into the sw phases
    by shuffles; else column by column."""
    xt, wt = k2.in_types[:2]
    _, _, h, w = xt.shape
    hp, sw, wq = padded_input(xt, wt, k2.out_type, k2.attrs)
    pt, pl, _, _ = k2.attrs["pads"]
    Xp = padded_base(b, k2)
    stored = pairs is not None and k2.attrs.get("in_pairs")
    if stored:  # the input is pairs already: pair ic is a plane of 32-bit elements, half the f32 offset
        src0 = b.add(b.sdiv(xplane0, i64(2)), b.mul(ic, i64(h * w)))
    else:  # f32 planes: plane ic, or the first of pair ic's two
        src0 = b.add(xplane0, b.mul(ic, i64(h * w * (2 if pairs else 1))))
    dst0 = b.mul(ic, i64(hp * sw * wq))
    zero = fconst("f32", 0.0)
    vw = k2.vw
    vty, wide = ir.VectorType(F32, vw), ir.VectorType(F32, vw * sw)
    if pairs and not masked_lanes(vw):
        raise BackendError("a padded copy of plane pairs needs masked vectors")

    def phases(src, start, valid):  # the sw phase vectors of sw * vw columns from `start`
        if any(valid):
            ptr = b.bitcast(b.gep(k2.ins[0], [b.add(src, i64(start))]), wide.as_pointer())
            got = load_lanes(b, ptr, wide, valid)
        else:
            got = ir.Constant(wide, [0.0] * (vw * sw))
        return [got if sw == 1 else b.shuffle_vector(got, ir.Constant(wide, ir.Undefined), ir.Constant(
            ir.VectorType(ir.IntType(32), vw), [phase + sw * j for j in range(vw)])) for phase in range(sw)]

    def vector_row(src, row):
        for q0 in range(0, wq, vw):
            start = q0 * sw - pl  # the input column of phase 0's lane 0
            valid = [0 <= start + e < w for e in range(vw * sw)]
            vs = phases(src, start, valid)
            if pairs and not stored:
                vs = [pairs(b, v0, v1) for v0, v1 in zip(vs, phases(b.add(src, i64(h * w)), start, valid))]
            for phase, v in enumerate(vs):
                v = rnd(b, v) if rnd else v
                at = b.gep(Xp, [b.add(row, i64(phase * wq + q0))], inbounds=True)
                store_lanes(b, v, b.bitcast(at, vty.as_pointer()), wq - q0)

    with for_range(b, rows[1], start=rows[0], name="py") as yy:
        row = b.add(dst0, b.mul(yy, i64(sw * wq)))
        iy = b.sub(yy, i64(pt))
        inside = b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(h)))
        with b.if_else(inside) as (then, otherwise):
            with then:
                src = b.add(src0, b.mul(iy, i64(w)))
                if masked_lanes(vw):
                    vector_row(src, row)
                elif sw == 1:  # zeros, a plain copy of the row, zeros
                    for j in range(pl):
                        store(b, zero, Xp, b.add(row, i64(j)), "f32")
                    with for_range(b, w, name="px") as xx:
                        v = load(b, k2.ins[0], b.add(src, xx), "f32")
                        store(b, rnd(b, v) if rnd else v, Xp, b.add(b.add(row, i64(pl)), xx), "f32")
                    for j in range(pl + w, wq):
                        store(b, zero, Xp, b.add(row, i64(j)), "f32")
                else:
                    for phase in range(sw):
                        with for_range(b, wq, name="pq") as q:
                            ix = b.add(b.mul(q, i64(sw)), i64(phase - pl))
                            ok = b.and_(b.icmp_signed(">=", ix, i64(0)), b.icmp_signed("<", ix, i64(w)))
                            v = load(b, k2.ins[0], b.add(src, b.select(ok, ix, i64(0))), "f32")
                            v = rnd(b, v) if rnd else v
                            store(b, b.select(ok, v, zero), Xp, b.add(row, b.add(i64(phase * wq), q)), "f32")
            with otherwise:
                with for_range(b, sw * wq, name="pz") as xx:
                    store(b, zero, Xp, b.add(row, xx), "f32")


def padded_base(b, k2: KernelArgs):
    """The padded input copy in the scratch, after the im2col panels and PANEL_PAD * 2
    elements of slack (vector loads may reach that far either side; their lanes there
    are never used)."""
    xt, wt = k2.in_types[:2]
    S = b.bitcast(k2.scratch, F32.as_pointer())
    return b.gep(S, [i64(im2col_bytes(xt, wt, k2.out_type) // 4 + 2 * PANEL_PAD)], inbounds=True)


def padded_reader(b, k2: KernelArgs, panel):
    """The loads of panel `panel`'s im2col columns from the padded input copy:
    read(b, tap, v) -> vector v (<vw x f32>) of the im2col row whose first tap is
    element `tap` of the copy, (ic * hp + ky) * sw * wq + padded_column(kx). The vw
    columns of each vector span at most `segs` output rows y; the lanes of row y read
    consecutive elements of the copy (row sh*y + ky, phase kx % sw, from x + kx // sw),
    so each (vector, row) is one unaligned load at an offset fixed for the panel, and the
    rows' lanes are blended by masks computed here, once per panel. Columns past the
    last are zero."""
    xt, wt = k2.in_types[:2]
    _, _, oh, ow = k2.out_type.shape
    hp, sw, wq = padded_input(xt, wt, k2.out_type, k2.attrs)
    sh, pitch = k2.attrs["stride"][0], sw * wq  # elements per padded row
    vw, nr = k2.vw, panel_width(k2.vw)
    p = oh * ow
    vty = ir.VectorType(F32, vw)
    ity = ir.VectorType(I64, vw)
    # rows of whole vectors (ow a multiple of vw): each vector lies in one output row,
    # and where every panel is whole, no lane is ever past the last column
    segs = 1 if ow % vw == 0 else -(-(vw - 1) // ow) + 1
    whole = ow % vw == 0 and p % nr == 0
    Xp = padded_base(b, k2)
    c0 = b.mul(panel, i64(nr))
    parts = []  # per vector: [(mask, element offset of lane 0 in Xp)] per output row
    for v in range(nr // vw):
        cv = b.add(c0, i64(v * vw))
        cols = b.add(splat(b, cv, ity), ir.Constant(ity, list(range(vw))))
        rows = b.sdiv(cols, splat(b, i64(ow), ity))
        live = b.icmp_signed("<", cols, splat(b, i64(p), ity))
        y0 = b.sdiv(cv, i64(ow))
        vparts = []
        for sgi in range(segs):
            y = b.add(y0, i64(sgi))
            mask = None if whole else live if segs == 1 else b.and_(live, b.icmp_signed("==", rows, splat(b, y, ity)))
            ya = imin(b, y, i64(oh - 1))  # rows past the image are masked off: any in-bounds address
            vparts.append((mask, b.add(b.mul(ya, i64(sh * pitch - ow)), cv)))
        parts.append(vparts)
    zero = ir.Constant(vty, [0.0] * vw)

    def read(b, tap, v):
        vec = zero
        for mask, off in parts[v]:
            got = b.load(b.bitcast(b.gep(Xp, [b.add(tap, off)]), vty.as_pointer()), align=4)
            vec = got if mask is None else b.select(mask, got, vec)
        return vec
    return read


def im2col_padded(b, k2: KernelArgs, S, panel, pitches=None, ic=None):
    """Panel `panel` of a conv's im2col matrix from the padded input copy
    (padded_reader). `pitches` and `ic` as in im2col_packed."""
    xt, wt = k2.in_types[:2]
    _, icg, kh, kw = wt.shape
    padded = hp, sw, wq = padded_input(xt, wt, k2.out_type, k2.attrs)
    pitch = sw * wq
    vw, nr = k2.vw, panel_width(k2.vw)
    kdim = icg * kh * kw
    vty = ir.VectorType(F32, vw)
    read = padded_reader(b, k2, panel)
    panel_pitch, row_pitch = pitches or (kdim * nr, nr)
    dst0 = b.mul(panel, i64(panel_pitch))
    ic_lo = i64(0) if ic is None else ic
    with for_range(b, i64(icg) if ic is None else b.add(ic, i64(1)), start=ic_lo, name="ic") as ic:
        with for_range(b, kh, name="ky") as ky:
            tap0 = b.add(b.mul(ic, i64(hp * pitch)), b.mul(ky, i64(pitch)))
            r0 = b.add(b.mul(ic, i64(kh * kw)), b.mul(ky, i64(kw)))
            for kx in range(kw):
                dst = b.add(dst0, b.mul(b.add(r0, i64(kx)), i64(row_pitch)))
                tap = b.add(tap0, i64(padded_column(padded, kx)))
                for v in range(nr // vw):
                    b.store(read(b, tap, v),
                            b.bitcast(b.gep(S, [b.add(dst, i64(v * vw))], inbounds=True), vty.as_pointer()), align=4)


def im2col_panel(b, k2: KernelArgs, S, xplane0, panel, pitches, ic=None):
    """Panel `panel` of a conv's im2col matrix into S (`pitches`, `ic` as in
    im2col_packed): vector loads from the padded input copy for dilation 1, element by
    element otherwise."""
    if padded_input(*k2.in_types[:2], k2.out_type, k2.attrs) is not None:
        im2col_padded(b, k2, S, panel, pitches, ic)
        return
    _, _, h, w = k2.in_types[0].shape
    _, icg, kh, kw = k2.in_types[1].shape
    _, _, oh, ow = k2.out_type.shape
    (sh, sw), (dh, dw), (pt, pl, _, _) = k2.attrs["stride"], k2.attrs["dilation"], k2.attrs["pads"]
    im2col_packed(b, k2.ins[0], xplane0, S, icg, h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl,
                   k2.out_type.dtype, panel_width(k2.vw), panel, pitches, ic)
