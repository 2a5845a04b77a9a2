"""Convolution geometry shared by the conv kernels and kernel selection: which taps fall
inside, GEMM-shaped or not, the zero-padded input copy's layout, scratch sizes, thin
output planes, W^T packed in panels.
"""
from __future__ import annotations

from math import prod

from ....ir.types import TensorType
from ..emit import i64
from ..gemm import pack_b, panel_width


def inside_range(size: int, out: int, span: int, stride: int, pad: int) -> tuple[int, int]:
    """The output indices [lo, hi) whose whole window (`span` input positions from
    o * stride - pad) lies inside [0, size), at compile time."""
    lo = min(out, -(-pad // stride))
    return lo, max(lo, min(out, (size - span + pad) // stride + 1))


def range_for_tap(b, tap_off, stride, size, out_size):
    """Output indices o with 0 <= o*stride + tap_off < size, as [lo, hi) i64 values.
    tap_off = k*dilation - pad_lo (an i64 value)."""
    zero = i64(0)
    neg = b.sub(zero, tap_off)  # need o*stride >= -tap_off
    lo = b.select(b.icmp_signed(">", neg, zero),
                  b.sdiv(b.add(neg, i64(stride - 1)), i64(stride)), zero)
    last = b.sub(i64(size - 1), tap_off)  # o*stride <= size-1-tap_off
    hi = b.select(b.icmp_signed("<", last, zero), zero,
                  b.add(b.sdiv(last, i64(stride)), i64(1)))
    hi = b.select(b.icmp_signed(">", hi, i64(out_size)), i64(out_size), hi)
    hi = b.select(b.icmp_signed("<", hi, lo), lo, hi)
    return lo, hi


def conv_geometry(x: TensorType, w: TensorType, out: TensorType, attrs):
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    g = attrs["groups"]
    (sh, sw), (pt, pl, _, _) = attrs["stride"], attrs["pads"]
    pointwise = kh == kw == 1 and sh == sw == 1 and pt == pl == 0 and tuple(out.shape[2:]) == (h, wd)
    gemm = icg * kh * kw >= 4 and oc // g >= 4
    return pointwise, gemm

PANEL_PAD = 32  # the widest panel (AVX-512): scratch sizes are bounds for every target


def padded_input(x: TensorType, w: TensorType, out: TensorType, attrs):
    """(hp, sw, wq) of the zero-padded copy of the input planes that a dilation-1 f32
    GEMM convolution packs its im2col panels from (plain vector loads, no bounds
    checks), or None where the conv packs straight from its input. Each of the hp padded
    rows holds its columns split by phase (column sw * q + phase at phase * wq + q), so
    that the taps of consecutive outputs read consecutive elements at any stride."""
    pointwise, gemm = conv_geometry(x, w, out, attrs)
    if pointwise or not gemm or x.dtype != "f32" or tuple(attrs["dilation"]) != (1, 1):
        return None
    pt, pl, pb, pr = attrs["pads"]
    sw = attrs["stride"][1]
    return x.shape[2] + pt + pb, sw, -(-(x.shape[3] + pl + pr) // sw)


def padded_column(padded, kx: int) -> int:
    """Where tap column kx starts in a row of the padded copy (padded_input's (hp, sw,
    wq)): its phase's run of columns, then its offset in that run."""
    _, sw, wq = padded
    return kx % sw * wq + kx // sw


def im2col_bytes(x: TensorType, w: TensorType, out: TensorType) -> int:
    """The packed im2col panels' share of a GEMM conv's scratch (64-byte multiple)."""
    _, icg, kh, kw = w.shape
    nbytes = icg * kh * kw * (out.shape[2] * out.shape[3] + PANEL_PAD) * x.itemsize
    return -(-nbytes // 64) * 64


def conv_scratch(x: TensorType, w: TensorType, out: TensorType, attrs, transposed: bool,
                  codes: bool = False) -> tuple[int, int]:
    """(element offset of the transposed result C^T, total bytes) of a GEMM conv's
    scratch: the im2col panels (or, transposed, im2col^T; none for a transposed 1x1
    conv, which reads its input in place, except with `codes`: a bf16 one's codes of its
    input, bf16.k_conv2d_bf16_transposed), the padded input copy with PANEL_PAD * 2
    elements of slack either side, then C^T (P + PANEL_PAD rows of OC + PANEL_PAD: whole
    panels) if transposed."""
    pointwise, _ = conv_geometry(x, w, out, attrs)
    padded = padded_input(x, w, out, attrs)
    extra = 0 if padded is None else (w.shape[1] * prod(padded) + 4 * PANEL_PAD) * x.itemsize
    front = im2col_bytes(x, w, out) + extra
    if transposed and pointwise:  # bf16 codes: pairs of input rows, 4 bytes a position
        front = -(-w.shape[1] // 2) * (out.shape[2] * out.shape[3] + PANEL_PAD) * 4 if codes else 0
    front = -(-front // 64) * 64
    if not transposed:
        return 0, front
    ct = (out.shape[2] * out.shape[3] + PANEL_PAD) * (w.shape[0] + PANEL_PAD) * 4
    return front // 4, front + ct


def thin_panels(out: TensorType, vw: int) -> bool:
    """Whether a conv's output planes fill less than 90% of the column panels of vectors
    of vw lanes (conv_transposed)."""
    p, nr = out.shape[2] * out.shape[3], panel_width(vw)
    return p < 0.9 * -(-p // nr) * nr


def conv_weights_packed(value, vw: int):
    """A transposed conv's weight [OC, IC, KH, KW] as packed W^T panels (conv_transposed)."""
    return pack_b(value.reshape(value.shape[0], -1).T, vw)
