"""Depthwise convs (groups == channels): the masked register-block kernel for 256- and
512-bit vectors ("depthwise_masked") and the row kernel elsewhere ("depthwise").
"""
from __future__ import annotations

from llvmlite import ir

from ....ir.types import TensorType
from ..emit import F32, i64, load, store
from ..gemm import splat
from ..kernel_args import KernelArgs
from ..loops import alloca_in_entry, for_range
from ..parallel import parallel
from ..vectors import load_lanes, store_lanes, strided_load
from .conv_shapes import inside_range
from .epilogue import row_epilogue, whole_epilogue


# Vectors of output columns per register block of the depthwise kernel: with a 3x3
# window, 4 x 9 multiply-adds per block hide the FMA latency and leave registers for
# the nine weight splats (AVX2: 4 + 9 + 2 of 16).
DW_BLOCK = 4


def depthwise(x: TensorType, w: TensorType, out: TensorType, attrs) -> bool:
    """Whether a conv runs as k_conv2d_depthwise: one input channel per group (any
    channel multiplier), f32 activations, sizes known at compile time."""
    shapes = (*x.shape, *w.shape, *out.shape)
    return (all(isinstance(s, int) for s in shapes) and attrs["groups"] == x.shape[1] and w.shape[1] == 1
            and x.dtype == out.dtype == "f32" and w.dtype in ("f32", "f16"))


def dw_plane(b, k2: KernelArgs, t):
    """Output plane t (image * OC + channel) of a depthwise conv: the element offset of
    its input plane and its kh * kw weights (f32 values)."""
    (_, c, h, w), (oc, _, kh, kw) = k2.in_types[0].shape, k2.in_types[1].shape
    ni, o = b.sdiv(t, i64(oc)), b.srem(t, i64(oc))
    xplane = b.mul(b.add(b.mul(ni, i64(c)), b.sdiv(o, i64(oc // c))), i64(h * w))
    return xplane, [load(b, k2.ins[1], b.add(b.mul(o, i64(kh * kw)), i64(j)), k2.in_types[1].dtype)
                    for j in range(kh * kw)]

# Output rows per register block of the masked depthwise kernel: with 32 registers
# (AVX-512) six rows' accumulators, the 3x3 window's weight splats and the loaded inputs
# fit; with 16 (AVX2), four.
DW_ROWS = {16: 6, 8: 4}

# Planes of at most this many (row, vector) pairs are emitted without a row loop.
DW_STATIC_VECTORS = 64


def k_conv2d_depthwise_masked(b, k: KernelArgs):
    """A depthwise convolution for 256- and 512-bit vectors (x86: native masked loads and
    stores), one output plane per work item, in register blocks of up to DW_ROWS output
    rows by one vector of output columns: each input row
    the block reads is loaded once per tap column (a masked load where the taps leave the
    row: the zero padding comes from the mask, so no border columns are computed apart)
    and feeds every output row of the block that uses it. Rows whose window leaves the
    image are handled at compile time (the border blocks are unrolled, the others run in
    a loop); the last vector of a row is stored masked. The epilogue is applied in
    registers where its extra operands are one value per plane (a bias), else to each
    block once it is stored. `attrs["out_plane_pitch"]` (fuse_pw_dw: a band of output
    rows, stored into the whole result's planes): elements from one output plane to the
    next, where they are not oh * ow (the epilogue must then run in registers). Unlike
    the row kernel (k_conv2d_depthwise), it loads each input vector once for all the
    block's output rows and needs no border columns apart: much faster where masked
    loads and stores are native."""
    parallel(b, k, k.in_types[0].shape[0] * k.in_types[1].shape[0], _MaskedPlanes(k).plane)


class _Geometry:
    """A depthwise conv's shapes, strides, dilations and pads, and the output rows whose
    taps all lie in the image ([y_lo, y_hi))."""

    def __init__(self, k: KernelArgs):
        self.k = k
        xt, wt = k.in_types[:2]
        self.n, _, self.h, self.w = xt.shape
        self.oc, _, self.kh, self.kw = wt.shape
        _, _, self.oh, self.ow = k.out_type.shape
        (self.sh, self.sw), (self.dh, self.dw), (self.pt, self.pl, _, _) = \
            k.attrs["stride"], k.attrs["dilation"], k.attrs["pads"]
        self.y_lo, self.y_hi = inside_range(self.h, self.oh, (self.kh - 1) * self.dh + 1, self.sh, self.pt)


class _MaskedPlanes(_Geometry):
    """k_conv2d_depthwise_masked's geometry; `plane` is its work item (one output plane)."""

    def __init__(self, k: KernelArgs):
        super().__init__(k)
        vw = self.vw = k.vw
        self.rows_per = DW_ROWS[min(vw, 16)]
        self.vty, self.wide = ir.VectorType(F32, vw), ir.VectorType(F32, vw * self.sw)
        self.chunks = list(range(0, self.ow, vw))
        self.epi_all = row_epilogue(k, 2, 2)
        self.in_regs = self.epi_all is not None and self.epi_all.in_registers
        self.keep = ir.Constant(ir.VectorType(ir.IntType(32), vw), [j * self.sw for j in range(vw)])

    def plane(self, b, k2, t, _):
        xplane, wts = dw_plane(b, k2, t)
        wv = [splat(b, v, self.vty) for v in wts]
        oplane = b.mul(t, i64(self.k.attrs.get("out_plane_pitch", self.oh * self.ow)))
        epi = row_epilogue(k2, 2, 2) if self.epi_all is not None else None
        at = (k2, t, xplane, wv, oplane, epi)
        oh, rows_per, y_lo = self.oh, self.rows_per, self.y_lo
        if oh * len(self.chunks) <= DW_STATIC_VECTORS:
            self.static_blocks(b, at, 0, oh)
            return
        inner = (self.y_hi - y_lo) // rows_per
        self.static_blocks(b, at, 0, y_lo)
        if inner:
            with for_range(b, i64(inner), name="yb") as yb:
                self.block(b, at, b.add(i64(y_lo), b.mul(yb, i64(rows_per))), rows_per, None)
        self.static_blocks(b, at, y_lo + inner * rows_per, oh)

    def static_blocks(self, b, at, y_from: int, y_to: int):
        count = y_to - y_from
        if count <= 0:
            return
        nb = -(-count // self.rows_per)
        for i in range(nb):
            r0, r1 = y_from + count * i // nb, y_from + count * (i + 1) // nb
            self.block(b, at, i64(r0), r1 - r0, r0)

    def block(self, b, at, y0, rows: int, first: int | None):
        """Output rows [y0, y0 + rows); `first` is y0 where it is known at compile
        time (a border block: its tap rows outside the image are skipped), else
        every tap row lies in the image."""
        k2, t, xplane, wv, oplane, epi = at
        X, O = k2.ins[0], k2.out
        ow, vw, vty = self.ow, self.vw, self.vty
        for x0 in self.chunks:
            accs = self.accumulate(b, X, xplane, wv, y0, rows, first, x0)
            for r in range(rows):
                acc = accs[r] if accs[r] is not None else ir.Constant(vty, [0.0] * vw)
                pos = b.add(b.mul(b.add(y0, i64(r)), i64(ow)), i64(x0))
                if self.in_regs:
                    acc = epi.apply(b, t, pos, acc)
                store_lanes(b, acc, b.bitcast(b.gep(O, [b.add(oplane, pos)], inbounds=True), vty.as_pointer()),
                            ow - x0)
        if epi is not None and not self.in_regs:
            epi(b, t, 1, b.mul(y0, i64(ow)), rows * ow)

    def accumulate(self, b, X, xplane, wv, y0, rows, first, x0):
        """The block's accumulators for the vector of output columns from x0: each input
        row it reads loaded once per tap column, feeding every output row that uses it."""
        sh, sw, dh, dw, kh, kw, h, w = self.sh, self.sw, self.dh, self.dw, self.kh, self.kw, self.h, self.w
        accs = [None] * rows
        for r_in in range((rows - 1) * sh + (kh - 1) * dh + 1):
            users = [(r, ky) for r in range(rows) for ky in range(kh) if r * sh + ky * dh == r_in]
            if not users:
                continue
            if first is not None and not 0 <= first * sh - self.pt + r_in < h:
                continue
            iy = b.add(b.mul(y0, i64(sh)), i64(r_in - self.pt))
            rbase = b.add(xplane, b.mul(iy, i64(w)))
            for kx in range(kw):
                col = x0 * sw + kx * dw - self.pl
                valid = [0 <= col + e < w for e in range(self.vw * sw)]
                if not any(valid):
                    continue
                ptr = b.bitcast(b.gep(X, [b.add(rbase, i64(col))], inbounds=True), self.wide.as_pointer())
                xv = load_lanes(b, ptr, self.wide, valid)
                if sw > 1:
                    xv = b.shuffle_vector(xv, ir.Constant(self.wide, ir.Undefined), self.keep)
                for r, ky in users:
                    p = b.fmul(wv[ky * kw + kx], xv, flags=("contract",))
                    accs[r] = p if accs[r] is None else b.fadd(accs[r], p, flags=("contract",))
        return accs


def k_conv2d_depthwise(b, k: KernelArgs):
    """A depthwise convolution, one output plane per work item, row by row: the output
    row's columns whose taps all fall inside the input row (and whose strided loads stay
    in it) are built in vector registers, DW_BLOCK vectors at a time, from one vector
    load and one multiply-add per tap (no im2col, no read-modify-write of the output);
    the few border columns take the taps one by one with bounds checks, and rows whose
    window leaves the image skip those tap rows. Each finished row takes the epilogue
    while it is in cache."""
    rows = _Rows(k)
    parallel(b, k, rows.n * rows.oc, rows.plane)
    if rows.epi_all is not None and not rows.row_epi:
        whole_epilogue(b, k, 2)


class _Rows(_Geometry):
    """k_conv2d_depthwise's geometry; `plane` is its work item (one output plane)."""

    def __init__(self, k: KernelArgs):
        super().__init__(k)
        kw, dw, sw, pl, w, ow = self.kw, self.dw, self.sw, self.pl, self.w, self.ow
        # output columns whose every tap (and strided load) lies inside the input row
        self.x_lo = min(ow, -(-pl // sw))
        self.x_hi = max(self.x_lo, min(ow, (w + pl - (kw - 1) * dw) // sw))
        vw = self.vw = k.vw
        self.widths = []  # (width, vectors) of the static blocks after the DW_BLOCK loop
        span = self.x_hi - self.x_lo
        self.blocks = span // (DW_BLOCK * vw) if vw >= 4 else 0
        rest = span - self.blocks * DW_BLOCK * vw
        width = vw
        while width >= 4 and rest >= width:
            self.widths.append((width, rest // width))
            rest -= rest // width * width
            width //= 2
        self.x_vec_end = self.x_hi - rest
        self.epi_all = row_epilogue(k, 2, 2)
        self.row_epi = self.epi_all is not None and self.epi_all.supports_cols

    def plane(self, b, k2, t, _):
        xplane, wts = dw_plane(b, k2, t)
        oplane = b.mul(t, i64(self.oh * self.ow))
        epi = row_epilogue(k2, 2, 2) if self.row_epi else None
        for y0, y1, checked in ((0, self.y_lo, True), (self.y_lo, self.y_hi, False), (self.y_hi, self.oh, True)):
            if y1 > y0:
                with for_range(b, i64(y1), start=i64(y0), name="y") as y:
                    self.row(b, k2, t, xplane, wts, oplane, epi, y, checked)

    def row(self, b, k2, t, xplane, wts, oplane, epi, y, checked: bool):
        taps = []  # per tap row: (in the image (i1) or None, the input row's element offset)
        for ky in range(self.kh):
            iy = b.add(b.mul(y, i64(self.sh)), i64(ky * self.dh - self.pt))
            ok = b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(self.h))) if checked else None
            taps.append((ok, b.add(xplane, b.mul(b.select(ok, iy, i64(0)) if checked else iy, i64(self.w)))))
        obase = b.add(oplane, b.mul(y, i64(self.ow)))
        row = (k2, wts, taps, obase)
        vw = self.vw
        self.scalar_cols(b, row, 0, self.x_lo)
        if self.blocks:
            with for_range(b, i64(self.blocks), name="xb") as xb:
                self.vector_block(b, row, b.add(i64(self.x_lo), b.mul(xb, i64(DW_BLOCK * vw))), vw, DW_BLOCK)
        x0 = self.x_lo + self.blocks * DW_BLOCK * vw
        for width, count in self.widths:
            self.vector_block(b, row, i64(x0), width, count)
            x0 += width * count
        self.scalar_cols(b, row, self.x_vec_end, self.ow)
        if epi is not None:
            epi(b, t, 1, b.mul(y, i64(self.ow)), self.ow)

    def vector_block(self, b, row, x0, width, count):
        """count vectors of width columns from output column x0."""
        k2, wts, taps, obase = row
        X, O = k2.ins[0], k2.out
        kw, sw, dw, pl = self.kw, self.sw, self.dw, self.pl
        vty = ir.VectorType(F32, width)
        accs = [alloca_in_entry(b, vty) for _ in range(count)]
        for a in accs:
            b.store(ir.Constant(vty, [0.0] * width), a)
        splats = {}
        for ky, (ok, rbase) in enumerate(taps):
            def tap_row():
                for kx in range(kw):
                    wv = splats.setdefault((ky, kx, width), splat(b, wts[ky * kw + kx], vty))
                    at = b.add(rbase, b.add(b.mul(x0, i64(sw)), i64(kx * dw - pl)))
                    for v, a in enumerate(accs):
                        xv = strided_load(b, X, b.add(at, i64(v * width * sw)), width, sw)
                        b.store(b.fadd(b.load(a), b.fmul(wv, xv, flags=("contract",)), flags=("contract",)), a)
            if ok is None:
                tap_row()
            else:
                with b.if_then(ok):
                    splats.clear()  # values made inside the branch do not dominate later code
                    tap_row()
                splats.clear()
        for v, a in enumerate(accs):
            dst = b.gep(O, [b.add(obase, b.add(x0, i64(v * width)))], inbounds=True)
            b.store(b.load(a), b.bitcast(dst, vty.as_pointer()), align=4)

    def scalar_cols(self, b, row, x_from: int, x_to: int):
        """Output columns [x_from, x_to) one by one, each tap bounds-checked."""
        if x_to <= x_from:
            return
        k2, wts, taps, obase = row
        X, O = k2.ins[0], k2.out
        kw, sw, dw, pl, w = self.kw, self.sw, self.dw, self.pl, self.w
        zero = ir.Constant(F32, 0.0)
        with for_range(b, i64(x_to), start=i64(x_from), name="xs") as x:
            acc = alloca_in_entry(b, F32)
            b.store(zero, acc)
            for ky, (ok, rbase) in enumerate(taps):
                def tap_row():
                    for kx in range(kw):
                        ix = b.add(b.mul(x, i64(sw)), i64(kx * dw - pl))
                        inside = b.and_(b.icmp_signed(">=", ix, i64(0)), b.icmp_signed("<", ix, i64(w)))
                        v = load(b, X, b.add(rbase, b.select(inside, ix, i64(0))), "f32")
                        v = b.select(inside, v, zero)
                        b.store(b.fadd(b.load(acc), b.fmul(wts[ky * kw + kx], v, flags=("contract",)),
                                       flags=("contract",)), acc)
                if ok is None:
                    tap_row()
                else:
                    with b.if_then(ok):
                        tap_row()
            store(b, b.load(acc), O, b.add(obase, x), "f32")
