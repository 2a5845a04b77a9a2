"""A 1x1 conv fused into the depthwise conv that alone reads it (MobileNet's expand ->
depthwise), so the wide tensor between them never goes to memory.

MobileNetV2's first expand writes 96 x 112 x 112 f32 values (4.6 MiB) that the stride-2
depthwise conv then reads back: both run at the memory's speed, not the cores'. Fused,
the depthwise conv's output rows go in bands; per band (a work item) the 1x1 conv's
kernel computes just the input rows the band's windows cover, all channels, into a
buffer that stays in the core's L2 cache, and the depthwise kernel reads them from
there. Both are the ordinary kernels (conv.k_conv2d, quantized.k_conv2d_q4 for a bf16 weight),
emitted for the band's shapes: the band's input rows are first copied out of the input
planes (a 1x1 conv's kernel reads planes of its own shape); the depthwise kernel stores
its band of output rows straight into the result's planes (out_plane_pitch). Each
output value is computed by the same code over the same operands as unfused: the
results are the same, bit for bit on MobileNetV2, else up to where the depthwise code
for a band's rows contracts its products into FMAs otherwise than the whole plane's (a
rounding). The rows around a band's are computed twice (by both bands that need them):
a band holds BAND_BYTES of input rows.

Kernel selection (select.fuse_pointwise) decides the fusion: the 1x1 conv's plan is
"in_depthwise", the depthwise conv's "fused_depthwise". The IR keeps both ops; the
memory plan still places the 1x1 conv's result (never written), and the depthwise
conv's scratch holds one slot per work item, of which each thread uses its first
(parallel.parallel's chunk_start).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..emit import F32, I8, emit_memcpy, i64
from ..kernel_args import KernelArgs
from ..loops import for_range
from ..parallel import parallel

from ..symbolic import KType
from ..target import masked_lanes
from .conv import k_conv2d
from .conv_shapes import conv_geometry, conv_scratch, thin_panels
from .depthwise import depthwise
from .epilogue import row_epilogue
from .schemes import quantized_weight


# Fuse where the 1x1 conv's result would be at least this large (twice a 1 MiB L2):
# larger ones gain clearly from fusing, in f32 and bf16; for smaller ones the halo rows
# and the smaller GEMMs cost more than the traffic saved where the tensor stays in L3.
FUSE_MIN_BYTES = 2 << 20

# Input rows of the depthwise conv (all channels, f32) per band: with the band's copy
# of the 1x1 conv's input and the output rows, within a 1 MiB L2.
BAND_BYTES = 512 << 10

ALIGN = 64


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _static(*types) -> bool:
    return all(isinstance(d, int) for t in types for d in t.shape)


def _per_channel(op) -> bool:
    """Whether op's epilogue operands (2 on) are per-channel values or scalars: the
    same for every band."""
    for v in op.operands[2:]:
        s = v.type.shape
        if not _static(v.type) or (len(s) == 4 and (s[0] != 1 or s[2] != 1 or s[3] != 1)) or \
                (len(s) != 4 and v.type.numel != 1):
            return False
    return True


def pointwise_producer(op):
    """For a depthwise conv2d `op`: the 1x1 conv whose result only it reads, where the
    two may fuse on any target (FUSE_MIN_BYTES, f32 or bf16 weights, static shapes,
    per-channel epilogues, dilation 1, stride <= 2); else None."""
    if op.name != "cuvil.conv2d" or len(op.operands) < 2:
        return None
    x, w, out = (v.type for v in (*op.operands[:2], op.result))
    if not _static(x, w, out) or not depthwise(x, w, out, op.attrs) or w.dtype != "f32" \
            or tuple(op.attrs["dilation"]) != (1, 1) or max(op.attrs["stride"]) > 2:
        return None
    wdef = op.operands[1].defining_op
    a = op.operands[0].defining_op
    if wdef is None or wdef.name != "cuvil.constant" or a is None or a.name != "cuvil.conv2d" \
            or len(op.operands[0].uses) != 1 or len(a.operands) < 2:
        return None
    xa, wa = (v.type for v in a.operands[:2])
    if not _static(xa, wa, a.result.type) or a.attrs["groups"] != 1 or xa.dtype != "f32" \
            or not all(conv_geometry(xa, wa, a.result.type, a.attrs)):
        return None
    scheme = quantized_weight(a)
    adef = a.operands[1].defining_op
    if scheme not in (None, "bf16") or (scheme is None and (adef is None or adef.name != "cuvil.constant")):
        return None
    if (scheme is None) == bool(a.attrs.get("act_quant")):
        return None
    if not (_per_channel(a) and _per_channel(op)) or a.result.type.numel * 4 < FUSE_MIN_BYTES:
        return None
    return a


@dataclass(frozen=True)
class Plan:
    """The bands of a fused pair: `rows` output rows each (the last may have fewer),
    `count` of them per image, as runs (first, end, geometry) of consecutive bands of
    one geometry (rows, top padding, input rows held); a work item's scratch slot of
    `slot` bytes: the band's input rows of the depthwise conv (from 0), its copy of the
    1x1 conv's input rows (from byte `inp`) and the 1x1 conv's own scratch (from
    `a_scratch`)."""
    rows: int
    count: int
    runs: tuple
    inp: int
    a_scratch: int
    slot: int


def plan(a, b) -> Plan:
    _, k, h, w = a.operands[0].type.shape
    c = a.result.type.shape[1]
    oh = b.result.type.shape[2]
    kh = b.operands[1].type.shape[2]
    sh, pt = b.attrs["stride"][0], b.attrs["pads"][0]
    most = max(kh, BAND_BYTES // (c * w * 4))  # input rows a band may hold
    rows = min(oh, max(1, (most - kh) // sh + 1))
    count = -(-oh // rows)
    geoms = []
    for i in range(count):
        y0, y1 = i * rows, min(oh, (i + 1) * rows)
        lo, hi = y0 * sh - pt, (y1 - 1) * sh - pt + kh  # the input rows its windows cover
        r0, r1 = max(lo, 0), min(hi, h)
        geoms.append((y1 - y0, r0 - lo, r1 - r0))
    runs, start = [], 0
    for i in range(1, count + 1):
        if i == count or geoms[i] != geoms[start]:
            runs.append((start, i, geoms[start]))
            start = i
    held = max(g[2] for g in geoms)
    a_need = max(conv_scratch(KType((1, k, g[2], w)), a.operands[1].type, KType((1, c, g[2], w)), a.attrs,
                               False)[1] for g in geoms)
    inp = _align(c * held * w * 4)
    a_at = inp + _align(k * held * w * 4)
    return Plan(rows, count, tuple(runs), inp, a_at, a_at + _align(a_need))


def fused_scratch_bytes(b) -> int:
    """A depthwise conv's scratch where it may fuse (pointwise_producer): a slot per work
    item (image, band)."""
    a = pointwise_producer(b)
    if a is None:
        return 0
    p = plan(a, b)
    return a.operands[0].type.shape[0] * p.count * p.slot


def fusable(a, b, vw: int, packs_b: bool, dw_args: KernelArgs) -> bool:
    """Whether the pair runs fused on a target of vw lanes: the 1x1 conv's kernel for each
    band's shapes reads the weight in the layout the whole conv's would (column panels,
    not transposed: its weight is not packed, no band's planes are thin), and the
    depthwise conv runs the masked kernel with its epilogue in registers (it stores a
    band's rows straight into the result's planes: out_plane_pitch)."""
    if packs_b or not masked_lanes(vw):
        return False
    epi = row_epilogue(dw_args, 2, 2)
    if epi is not None and not epi.in_registers:
        return False
    _, _, _, w = a.operands[0].type.shape
    c = a.result.type.shape[1]
    return not any(thin_panels(t, vw) for t in [a.result.type] + [KType((1, c, g[2], w)) for _, _, g in
                                                                   plan(a, b).runs])


def emit(b, k: KernelArgs, a, dw, a_args: KernelArgs, dw_args: KernelArgs, emit_a):
    """The fused kernel. k: the call's arguments (out: the depthwise conv's result; ins:
    the 1x1 conv's operands, then the depthwise conv's from operand 1); a_args / dw_args:
    each op's own KernelArgs as unfused (types, attrs, consts); emit_a: the 1x1 conv's
    kernel emitter."""
    p = plan(a, dw)
    n, kin, h, w = a.operands[0].type.shape
    c = a.result.type.shape[1]
    _, oc, oh, ow = dw.result.type.shape  # oc: c times the depthwise conv's channel multiplier
    sh, pt = dw.attrs["stride"][0], dw.attrs["pads"][0]
    kh = dw.operands[1].type.shape[2]
    na = len(a.operands)

    def item(b, k2, t, ex):
        ni, bi = b.sdiv(t, i64(p.count)), b.srem(t, i64(p.count))
        base = b.gep(k2.scratch, [b.mul(ex[-1], i64(p.slot))], inbounds=True)

        def at(off, ty=F32):
            return b.bitcast(b.gep(base, [i64(off)], inbounds=True), ty.as_pointer())
        buf, inp = at(0), at(p.inp)
        x = k2.ins[0]
        for first, end, (rows, pad, held) in p.runs:
            inside = b.icmp_signed("==", bi, i64(first)) if end == first + 1 else \
                b.and_(b.icmp_signed(">=", bi, i64(first)), b.icmp_signed("<", bi, i64(end)))
            with b.if_then(inside):
                y0 = b.mul(bi, i64(p.rows))
                r0 = b.add(b.mul(y0, i64(sh)), i64(pad - pt))
                with for_range(b, kin, name="ci") as ci:  # the band's rows of each input plane
                    src = b.mul(b.add(b.mul(b.add(b.mul(ni, i64(kin)), ci), i64(h)), r0), i64(w))
                    emit_memcpy(b, b.gep(inp, [b.mul(ci, i64(held * w))], inbounds=True),
                            b.gep(x, [src], inbounds=True), held * w * 4)
                emit_a(b, KernelArgs(out=buf, out_type=KType((1, c, held, w)), ins=[inp] + k2.ins[1:na],
                                     in_types=[KType((1, kin, held, w))] + a_args.in_types[1:],
                                     attrs=a_args.attrs, consts=a_args.consts, vw=k2.vw,
                                     scratch=at(p.a_scratch, I8), int8=k2.int8, bf16=k2.bf16,
                                     plan={"form": a_args.plan["band_form"]}))
                pads = list(dw.attrs["pads"])
                pads[0], pads[2] = pad, max(0, (rows - 1) * sh + kh - pad - held)
                dst = b.add(b.mul(ni, i64(oc * oh * ow)), b.mul(y0, i64(ow)))  # the band's first output row
                k_conv2d(b, KernelArgs(out=b.gep(k2.out, [dst], inbounds=True), out_type=KType((1, oc, rows, ow)),
                                       ins=[buf] + k2.ins[na:],
                                       in_types=[KType((1, c, held, w))] + dw_args.in_types[1:],
                                       attrs=dict(dw_args.attrs, pads=pads, out_plane_pitch=oh * ow),
                                       consts=dw_args.consts, vw=k2.vw, int8=k2.int8, bf16=k2.bf16,
                                       plan={"form": "depthwise_masked"}))
    parallel(b, k, n * p.count, item, chunk_start=True)
