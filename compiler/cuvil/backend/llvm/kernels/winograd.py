"""Winograd F(2x2, 3x3) convs (the plan's "winograd" form): the weights transformed at
compile time, the input patches and output tiles transformed in registers, 16 GEMMs in
between.
"""
from __future__ import annotations

from llvmlite import ir
import numpy as np

from ....ir.types import TensorType
from ..emit import F32, i64
from ..gemm import emit_gemm, row_blocks, splat
from ..kernel_args import KernelArgs
from ..loops import for_range
from ..parallel import parallel
from ..target import masked_lanes
from ..vectors import load_lanes, store_lanes
from .conv_shapes import inside_range
from .epilogue import row_epilogue


# A 3x3 stride-1 conv as 16 GEMMs: each 2x2 output tile comes from the 4x4 input patch
# d over it as Y = A^T [(G g G^T) * (B^T d B)] A, so the 36 multiply-adds per output and
# input channel become 16 per tile (2.25x fewer), at the cost of the two transforms
# (additions only) and of writing V = B^T d B and M = U * V to scratch. The transform
# matrices hold 0, +-1 and 1/2: the result differs from the direct sum by a few ulps.
WINO_BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))

WINO_G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))

WINO_AT = ((1, 1, 1, 0), (0, 1, -1, -1))

# Channels and 2x2 tiles below which the direct GEMM conv is kept. A 7x7 plane has 16
# tiles: ResNet-50's 512 -> 512 convs there gain at one thread but not at two, where the
# transformed weight (16/9 of the bytes) streams from memory and bandwidth eats the gain.
WINO_MIN_CHANNELS = 16

WINO_MIN_TILES = 32


def winograd_shape(x, w, out, attrs, vw: int) -> bool:
    """Whether a GEMM conv of these static types runs Winograd on vectors of vw f32 lanes."""
    if not masked_lanes(vw) or tuple(w.shape[2:]) != (3, 3) or tuple(attrs["stride"]) != (1, 1) or tuple(attrs["dilation"]) != (1, 1):
        return False
    tiles = -(-out.shape[2] // 2) * -(-out.shape[3] // 2)
    return min(w.shape[0], w.shape[1]) >= WINO_MIN_CHANNELS and tiles >= WINO_MIN_TILES


def winograd_weights(value):
    """U = G g G^T of each [OC, IC, 3, 3] filter as [16, OC, IC] (element 4 * i + j of the
    4x4 transformed filter first), f32."""
    g = np.asarray(WINO_G, np.float64)
    u = np.einsum("ak,oikl,bl->aboi", g, value.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(16, value.shape[0], value.shape[1]).astype(np.float32))


def winograd_geometry(out: TensorType) -> tuple[int, int, int]:
    """(tiles per row, tiles, row pitch of V and M): a row of V / M holds the tiles of
    every tile row back to back, with a vector's slack at the end (the last vector of a
    tile row may run past it)."""
    tx = -(-out.shape[3] // 2)
    t = -(-out.shape[2] // 2) * tx
    return tx, t, -(-t // 16) * 16 + 16


def winograd_scratch(w: TensorType, out: TensorType) -> int:
    _, _, tp = winograd_geometry(out)
    if winograd_blocked(w.shape[1], w.shape[0], out):  # a slot of one tile row per tile row
        return -(-out.shape[2] // 2) * 16 * (w.shape[0] + w.shape[1]) * _winograd_row_pitch(out) * 4
    return 16 * (w.shape[0] + w.shape[1]) * tp * 4


def _lin(b, coeffs, vecs):
    """sum(c * v) over the nonzero coefficients (each +-1 or 1/2: adds and subtracts)."""
    acc = None
    for c, v in zip(coeffs, vecs):
        if c == 0:
            continue
        if abs(c) != 1:
            v = b.fmul(v, splat(b, ir.Constant(F32, abs(c)), v.type))
        if acc is None:
            acc = v if c > 0 else b.fneg(v)
        else:
            acc = b.fadd(acc, v) if c > 0 else b.fsub(acc, v)
    return acc if acc is not None else ir.Constant(vecs[0].type, [0.0] * vecs[0].type.count)


def winograd_blocked(c: int, oc: int, out: TensorType) -> bool:
    """Whether a Winograd conv runs tile row by tile row (each thread's V and M rows in
    its cache, the transformed weight kept there across rows): small weights (16 * IC *
    OC f32 at most WINO_BLOCKED_WEIGHT_BYTES) and enough tile rows to share."""
    return 16 * c * oc * 4 <= WINO_BLOCKED_WEIGHT_BYTES and -(-out.shape[2] // 2) >= 8

# The largest transformed weight that the tile-row form re-reads for every tile row. At
# 1 MiB (128 -> 128 at 28x28) tile rows lost at one thread and gained little at two:
# kept whole.
WINO_BLOCKED_WEIGHT_BYTES = 256 << 10


def _winograd_row_pitch(out: TensorType) -> int:
    """Row pitch of V and M in the tile-row form: one tile row in whole 16-lane vectors."""
    return -(-winograd_geometry(out)[0] // 16) * 16


def k_conv2d_winograd(b, k: KernelArgs):
    """A conv_winograd convolution. The steps: (1) each tile row's 4x4 patches of an
    input channel -> V[16][IC][tiles] = B^T d B, a vector of tiles at a time (two masked
    loads of 2 * vw input columns per patch row give the patches' four columns as the
    even and odd lanes; the mask supplies the zero padding); (2) the 16 GEMMs M[e] =
    U[e] @ V[e] (U = winograd_weights, [OC, IC] each); (3) Y = A^T M A for a vector of
    tiles of an output channel at a time, the two columns of each tile interleaved into
    an output row and stored masked, with the epilogue in registers (one value per
    channel) or on each stored row pair. Per image, either each step across the threads
    over the whole plane (channels, (e, row block) items, output channels), or, for small
    weights (winograd_blocked), tile row by tile row: each thread runs all three steps
    for its rows in one slot of V and M, which stays in its cache instead of going
    through memory between the steps (worth most with several threads)."""
    return _Winograd(k).emit(b)


class _Winograd:
    """One Winograd convolution's geometry and the steps k_conv2d_winograd emits."""

    def __init__(self, k: KernelArgs):
        self.k = k
        xt, wt = k.in_types[:2]
        self.n, self.c, self.h, self.w = xt.shape
        self.oc = wt.shape[0]
        _, _, self.oh, self.ow = k.out_type.shape
        self.pt, self.pl, _, _ = k.attrs["pads"]
        vw = self.vw = k.vw
        self.tx_n, self.tiles, self.tp = winograd_geometry(k.out_type)
        self.ty_n = -(-self.oh // 2)
        self.vty, self.wide = ir.VectorType(F32, vw), ir.VectorType(F32, 2 * vw)
        self.chunks = list(range(0, self.tx_n, vw))
        i32 = ir.IntType(32)
        self.even = ir.Constant(ir.VectorType(i32, vw), [2 * j for j in range(vw)])
        self.odd = ir.Constant(ir.VectorType(i32, vw), [2 * j + 1 for j in range(vw)])
        self.inter = ir.Constant(ir.VectorType(i32, 2 * vw), [j // 2 + (vw if j % 2 else 0) for j in range(2 * vw)])
        self.epi_all = row_epilogue(k, 2, 2)
        self.in_regs = self.epi_all is not None and self.epi_all.in_registers
        self.in_lo, self.in_hi = inside_range(self.h, self.ty_n, 4, 2, self.pt)  # tile rows with all patch rows inside

    @staticmethod
    def scratch(b, k2):
        return b.bitcast(k2.scratch, F32.as_pointer())

    def epilogue(self, k2):
        return row_epilogue(k2, 2, 2) if self.epi_all is not None else None

    def patch_columns(self, b, X, row, tx0):
        """The four columns of one patch row for a vector of tiles from tile column tx0:
        two masked loads of 2 * vw input columns, split into even and odd lanes."""
        vw, w, vty, wide = self.vw, self.w, self.vty, self.wide
        cols = []
        for shift in (0, 2):
            col = 2 * tx0 - self.pl + shift
            valid = [0 <= col + e < w for e in range(2 * vw)]
            if not any(valid):
                cols += [ir.Constant(vty, [0.0] * vw)] * 2
                continue
            got = load_lanes(b, b.bitcast(b.gep(X, [b.add(row, i64(col))], inbounds=True), wide.as_pointer()),
                             wide, valid)
            cols += [b.shuffle_vector(got, got, self.even), b.shuffle_vector(got, got, self.odd)]
        return cols

    def input_row(self, b, k2, ci, xplane, ty, sty, v0, pitch):
        """Tile row ty of input channel ci into V[e][ci] at element v0 + (e * IC + ci) *
        pitch (sty: ty where known at compile time, its patch rows outside the image
        skipped; None: all inside)."""
        X, V = k2.ins[0], self.scratch(b, k2)
        h, w, c, vw, vty = self.h, self.w, self.c, self.vw, self.vty
        xplane = b.add(xplane, b.mul(ci, i64(h * w)))
        for tx0 in self.chunks:
            d = []  # d[r] = the four patch columns of patch row r, as vectors over tiles
            for r in range(4):
                if sty is not None and not 0 <= 2 * sty - self.pt + r < h:
                    d.append([ir.Constant(vty, [0.0] * vw)] * 4)
                    continue
                iy = b.add(b.mul(ty, i64(2)), i64(r - self.pt))
                d.append(self.patch_columns(b, X, b.add(xplane, b.mul(iy, i64(w))), tx0))
            tmp = [[_lin(b, WINO_BT[i], [d[r][j] for r in range(4)]) for j in range(4)] for i in range(4)]
            for i in range(4):
                for j in range(4):
                    dst = b.add(v0, b.add(b.mul(b.add(i64((4 * i + j) * c), ci), i64(pitch)), i64(tx0)))
                    b.store(_lin(b, WINO_BT[j], tmp[i]), b.bitcast(b.gep(V, [dst], inbounds=True), vty.as_pointer()),
                            align=4)

    def output_row(self, b, k2, t, ty, sty, m0, pitch, epi):
        """Tile row ty of output plane t (image * OC + channel) from M[e][channel] at
        element m0 + (e * OC + channel) * pitch (sty: ty where known, else both output
        rows exist)."""
        S, O = self.scratch(b, k2), k2.out
        oc, oh, ow, vty = self.oc, self.oh, self.ow, self.vty
        o = b.srem(t, i64(oc))
        oplane = b.mul(t, i64(oh * ow))
        rows = 2 if sty is None or 2 * sty + 1 < oh else 1
        for tx0 in self.chunks:
            m = [b.load(b.bitcast(b.gep(S, [b.add(m0, b.add(b.mul(b.add(i64(e * oc), o), i64(pitch)), i64(tx0)))],
                                        inbounds=True), vty.as_pointer()), align=4) for e in range(16)]
            tmp = [[_lin(b, WINO_AT[i], [m[4 * r + j] for r in range(4)]) for j in range(4)] for i in range(2)]
            for i in range(rows):
                y0, y1 = (_lin(b, WINO_AT[jj], tmp[i]) for jj in range(2))
                row = b.shuffle_vector(y0, y1, self.inter)  # columns 2 * tx0 + (0, 1, 2, ...)
                col = b.add(b.mul(b.add(b.mul(ty, i64(2)), i64(i)), i64(ow)), i64(2 * tx0))
                if self.in_regs:
                    row = epi.apply(b, t, col, row)
                store_lanes(b, row, b.bitcast(b.gep(O, [b.add(oplane, col)], inbounds=True), self.wide.as_pointer()),
                            ow - 2 * tx0)
        if epi is not None and not self.in_regs:
            epi(b, t, 1, b.mul(ty, i64(2 * ow)), rows * ow)

    def rows_of(self, b, body, lo, hi):
        """body(ty, static_ty) for every tile row: those outside [lo, hi) unrolled
        (static_ty an int), the others in a loop (static_ty None)."""
        ty_n = self.ty_n
        lo = max(0, min(lo, ty_n))
        hi = max(lo, min(hi, ty_n))
        for ty in range(lo):
            body(i64(ty), ty)
        if hi > lo:
            with for_range(b, i64(hi), start=i64(lo), name="ty") as ty:
                body(ty, None)
        for ty in range(hi, ty_n):
            body(i64(ty), ty)

    def dispatch(self, b, ty, lo, hi, body):
        """body(ty, static_ty) for one tile row ty (an i64 value): the compile-time
        variant where ty is outside [lo, hi), else the general one."""
        statics = [s for s in range(self.ty_n) if not lo <= s < hi]
        if not statics:
            body(ty, None)
            return
        outside = b.or_(b.icmp_signed("<", ty, i64(lo)), b.icmp_signed(">=", ty, i64(hi)))
        with b.if_else(outside) as (then, otherwise):
            with then:
                for s_ in statics:
                    with b.if_then(b.icmp_signed("==", ty, i64(s_))):
                        body(i64(s_), s_)
            with otherwise:
                body(ty, None)

    def emit(self, b):
        if winograd_blocked(self.c, self.oc, self.k.out_type):
            self.emit_by_tile_rows(b)
        else:
            self.emit_by_planes(b)

    def emit_by_tile_rows(self, b):
        """Tile row by tile row: each thread runs all three steps for its rows in one
        slot of V and M."""
        c, oc, h, w, vw = self.c, self.oc, self.h, self.w, self.vw
        rp = _winograd_row_pitch(self.k.out_type)
        slot = 16 * (c + oc) * rp

        def tile_row(b, k2, ty, ex):
            ni, first = ex[0], ex[1]
            v0 = b.mul(first, i64(slot))  # this thread's slot (its first row's), reused for all its rows
            m0 = b.add(v0, i64(16 * c * rp))
            xplane = b.mul(ni, i64(c * h * w))
            with for_range(b, c, name="ci") as ci:
                self.dispatch(b, ty, self.in_lo, self.in_hi,
                              lambda t_, s_: self.input_row(b, k2, ci, xplane, t_, s_, v0, rp))
            S = self.scratch(b, k2)
            with for_range(b, 16, name="e") as e:
                emit_gemm(b, k2.ins[1], b.mul(e, i64(oc * c)), c, S, b.add(v0, b.mul(e, i64(c * rp))), rp,
                          S, b.add(m0, b.mul(e, i64(oc * rp))), rp, oc, len(self.chunks) * vw, c, vw, F32)
            epi = self.epilogue(k2)
            with for_range(b, oc, name="oc") as o:
                t = b.add(b.mul(ni, i64(oc)), o)
                self.dispatch(b, ty, 0, self.oh // 2, lambda t_, s_: self.output_row(b, k2, t, t_, s_, m0, rp, epi))

        with for_range(b, self.n, name="n") as ni:
            parallel(b, self.k, self.ty_n, tile_row, [ni], chunk_start=True)

    def emit_by_planes(self, b):
        """Each step across the threads over the whole plane: input channels, (e, row
        block) GEMM items, output channels."""
        c, oc, h, w, vw, tp, tx_n = self.c, self.oc, self.h, self.w, self.vw, self.tp, self.tx_n

        def input_plane(b, k2, ci, ex):
            self.rows_of(b, lambda ty, sty: self.input_row(b, k2, ci, ex[0], ty, sty, b.mul(ty, i64(tx_n)), tp),
                         self.in_lo, self.in_hi)

        def gemm(b, k2, t, ex):
            e, rb = b.sdiv(t, i64(row_blocks(oc, vw))), b.srem(t, i64(row_blocks(oc, vw)))
            S = self.scratch(b, k2)
            emit_gemm(b, k2.ins[1], b.mul(e, i64(oc * c)), c, S, b.mul(e, i64(c * tp)), tp,
                      S, b.add(i64(16 * c * tp), b.mul(e, i64(oc * tp))), tp, oc, -(-self.tiles // vw) * vw, c, vw,
                      F32, blocks=(rb, b.add(rb, i64(1))))

        def output_plane(b, k2, i, ex):
            t = b.add(b.mul(ex[0], i64(oc)), i)
            epi = self.epilogue(k2)
            self.rows_of(b, lambda ty, sty: self.output_row(b, k2, t, ty, sty,
                                                            b.add(i64(16 * c * tp), b.mul(ty, i64(tx_n))), tp, epi),
                         0, self.oh // 2)

        with for_range(b, self.n, name="n") as ni:
            parallel(b, self.k, c, input_plane, [b.mul(ni, i64(c * h * w))])
            parallel(b, self.k, 16 * row_blocks(oc, vw), gemm, [])
            parallel(b, self.k, oc, output_plane, [ni])
