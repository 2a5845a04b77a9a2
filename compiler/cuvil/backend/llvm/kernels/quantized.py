"""Kernels for conv2d / matmul whose weight (operand 1) is a `cuvil.dequantize` of a
quantized constant: the weight stays 4-bit / 8-bit in the object.

int4_block: the GEMM (gemm_int4.py) dequantises the weight in registers, f32 compute; blob:
a matmul's B in int4 panels (gemm_int4.pack_q4_panels), a conv2d's plain Q4_0 rows.
int8_channel (with the op's `act_quant`): integer GEMM (gemm_dot.py); blob: gemm_dot.int8_blob
in the layout of the kernel's `DotIsa` (KernelArgs.int8, a target.DotIsa). The activations are quantized
once per call: a matmul's A into scratch (`int8_scratch_bytes`; per tile where M is a
runtime size), a conv's im2col panels straight from its padded input copy
(im2col_codes; elsewhere in place after packing; a bf16 conv over an even channel count
converts while it copies, into plane pairs of codes: pair_planes), a 1x1 conv's whole
panels straight from its input planes; each thread packs its panels into one slot of
the scratch.
bf16 (with `act_quant = {dtype: bf16}`, `precision: bf16`): bfloat16 operands, f32
accumulation. Where the target has a bf16 dot product (KernelArgs.bf16: AVX-512-BF16
`vdpbf16ps`), the integer GEMMs' schedule with bf16 codes; blob: gemm_dot.bf16_blob
(W^T panels for matmuls and for the convs that run transposed, k_conv2d_bf16_transposed:
those of thin output planes, and those over plane pairs, whose GEMM reads each pixel's
taps straight from the pairs, gather_at, with no im2col). A conv result that only such
convs read is stored as those pairs in the first place (stored_pairs: `out_pairs` on
the producer, `in_pairs` on its readers), also one they read as a residual where it is
a bf16 value (`pairs_extras`), and through a slice or max pool between (passes_pairs).
Elsewhere (the plain `bf16` isa) the f32 GEMMs (conv.py, matmul.py), their weights kept as
bf16 bits and widened as they are read (exact), the activations rounded to bf16 as they
are packed (a matmul's A, once per call into scratch; a conv's panels): the products are then exactly the
bf16 ones, at the f32 kernels' speed; blob: `plain_bf16_blob` (a matmul's B in
gemm.pack_b panels, a conv's rows as they are).
"""
from __future__ import annotations

import numpy as np

from ....errors import BackendError
from ....ir.ops.quant import bf16_decode
from ..emit import F32, I8, i64
from ..gemm import bf16_panel_order, emit_round_run, pack_b, packed_work_items, panel_width, row_blocks
from ..gemm_dot import (bf16_blob, code_type, emit_i8a_gemm, emit_i8b_gemm, emit_quantize_panel,
                        emit_quantize_rows, groups, int8_blob, panel_codes)
from ..gemm_int4 import emit_q4a_gemm, emit_q4b_gemm, pack_q4_panels
from ..kernel_args import KernelArgs
from ..loops import for_range
from ..parallel import parallel
from ..target import GENERIC_INT8
from ..vectors import imin
from .bf16 import copy_pairs, im2col_codes, k_conv2d_bf16_transposed, pair_order, pair_rows_store, pairs_of
from .conv import conv_pack_panel, conv_schedule, k_conv2d
from .conv_shapes import conv_geometry
from .epilogue import row_epilogue, tile_epilogue_of, whole_epilogue
from .matmul import matmul_packed
from .schemes import QROWS, bf16_bits, isa_of


def plain_bf16_blob(rows: np.ndarray, packed: bool, vw: int) -> np.ndarray:
    """rows [C, 2K] u8 (bf16 bytes) -> u8: a matmul's B ([K, C]) in gemm.pack_b panels of
    bf16 bits, each row's columns in gemm.bf16_panel_order (packed), else (a conv's weight) the rows' values as f32: the conv GEMM
    broadcasts them one at a time, and widening each there costs more than the halved
    bytes save (slower than f32 itself)."""
    if not packed:
        return np.ascontiguousarray(bf16_decode(rows).astype("<f4")).view(np.uint8).reshape(-1)
    bits = np.ascontiguousarray(rows).view("<u2")
    panels = pack_b(bits.T, vw)  # [P][K][NR]
    return np.ascontiguousarray(panels[..., bf16_panel_order(panels.shape[-1], vw)]).view(np.uint8).reshape(-1)


def quantized_blob(dq, layout: str, vw: int, isa=GENERIC_INT8):
    """The bytes the object embeds for the `cuvil.dequantize` op dq in `layout`, its kernel
    plan's (select.weight_layout; see the module doc)."""
    q = dq.operands[0].defining_op
    scale = dq.operands[-1].defining_op
    if q is None or q.name != "cuvil.constant" or scale.name != "cuvil.constant":
        raise BackendError("cuvil.dequantize of a non-constant is not supported by the backend")
    panels = "_panels" in layout
    if layout.startswith("bf16") and layout.endswith("_widened"):
        return plain_bf16_blob(q.value, panels, vw)
    if layout.startswith("bf16"):
        rows = q.value
        if layout.endswith("_pair_order"):
            _, icg, kh, kw = dq.attrs["shape"]
            rows = pair_order(rows, icg, kh * kw)
        return bf16_blob(rows, panels, vw)
    if layout.startswith("int8"):
        return int8_blob(q.value, scale.value, panels, vw, isa)
    return pack_q4_panels(q.value, vw) if panels else q.value


def _matmul_plain_bf16(b, k: KernelArgs):
    """The f32 packed GEMM on bf16 panels; A rounded to bf16 once into scratch, QROWS
    rows a task (where M is a runtime size, by each tile as it reads A: slower)."""
    kk = k.in_types[0].shape[-1]
    rows = k.in_types[0].numel // kk
    if not (isinstance(rows, int) and isinstance(kk, int)):
        return matmul_packed(b, k, bf16_bits, round_a=True)

    def round_rows(b, k2, t, _):
        begin = b.mul(t, i64(QROWS * kk))
        count = b.sub(imin(b, b.add(begin, i64(QROWS * kk)), i64(rows * kk)), begin)
        emit_round_run(b, k2.ins[0], b.bitcast(k2.scratch, F32.as_pointer()), begin, count, k2.vw)
    parallel(b, k, -(-rows // QROWS), round_rows)
    matmul_packed(b, k, bf16_bits, a=lambda b, k2: b.bitcast(k2.scratch, F32.as_pointer()))


def k_matmul_q4(b, k: KernelArgs):
    if k.plan.get("form") == "packed_bf16_widened":
        return _matmul_plain_bf16(b, k)
    at, bt = k.in_types[:2]
    ot = k.out_type
    kk, n = at.shape[-1], bt.shape[-1]
    rows = at.numel // kk
    epi = row_epilogue(k, 2, ot.rank - 1)
    if epi is not None and not epi.supports_cols:
        raise BackendError("matmul epilogue cannot be applied per tile")

    aq = k.attrs.get("act_quant")
    isa = isa_of(k, aq)
    whole = bool(aq) and isinstance(rows, int) and isinstance(kk, int)  # int8_scratch_bytes reserved it
    if whole:  # quantize A once, QROWS rows a task
        kp = groups(kk, isa) * isa.group

        def quant(b, k2, t, _):
            r0 = b.mul(t, i64(QROWS))
            left = b.sub(i64(rows), r0)
            n_rows = b.select(b.icmp_signed("<", left, i64(QROWS)), left, i64(QROWS))
            Q = b.gep(b.bitcast(k2.scratch, code_type(isa).as_pointer()), [b.mul(r0, i64(kp))], inbounds=True)
            emit_quantize_rows(b, k2.ins[0], b.mul(r0, i64(kk)), kk, n_rows, kk, Q, aq, isa, k2.vw)
        parallel(b, k, -(-rows // QROWS), quant)

    def items(b, k2, t, _):
        Bq = b.bitcast(k2.ins[1], I8.as_pointer())
        epi2, span = row_epilogue(k2, 2, ot.rank - 1), (t, b.add(t, i64(1)))
        if aq:
            Q = b.bitcast(k2.scratch, code_type(isa).as_pointer()) if whole else None
            emit_i8b_gemm(b, Q, k2.ins[0], kk, Bq, k2.out, n, rows, n, kk, k2.vw, aq, isa, epi2, span)
        else:
            emit_q4b_gemm(b, k2.ins[0], kk, Bq, k2.out, n, rows, n, kk, k2.vw, epi2, items=span)
    parallel(b, k, packed_work_items(rows, n, k.vw), items)


def k_conv2d_q4(b, k: KernelArgs):
    """gemm.py's conv-as-GEMM (conv.k_conv2d) with the quantized weight as the A rows."""
    xt, wt = k.in_types[:2]
    _, gemm = conv_geometry(xt, wt, k.out_type, k.attrs)
    if not gemm or k.out_type.dtype != "f32":
        raise BackendError(f"an int4 conv2d weight {list(wt.shape)} needs a GEMM-shaped f32 conv")
    if k.plan.get("form") == "gemm_bf16_widened":
        return k_conv2d(b, k, lambda b, k2: b.bitcast(k2.ins[1], F32.as_pointer()), round_panel=True)
    n, c, h, w = xt.shape
    oc, icg, kh, kw = wt.shape
    _, _, oh, ow = k.out_type.shape
    g = k.attrs["groups"]
    ocg, kdim, p = oc // g, icg * kh * kw, oh * ow
    nr = panel_width(k.vw)
    panels = -(-p // nr)
    pointwise, _ = conv_geometry(xt, wt, k.out_type, k.attrs)
    epi_all = row_epilogue(k, 2, 2)
    tile_epilogue = epi_all is not None and epi_all.supports_cols
    aq = k.attrs.get("act_quant")
    isa = isa_of(k, aq)
    if k.plan.get("form") == "transposed_bf16":
        return k_conv2d_bf16_transposed(b, k)
    with for_range(b, n * g, name="ng") as ng:
        ni, gi = b.sdiv(ng, i64(g)), b.srem(ng, i64(g))
        xplane0 = b.mul(b.add(b.mul(ni, i64(c)), b.mul(gi, i64(icg))), i64(h * w))
        row_base = b.add(b.mul(ni, i64(oc)), b.mul(gi, i64(ocg)))

        def pack(b, k2, pp, ex, slot):
            S = b.bitcast(k2.scratch, k2.ins[0].type)
            if k2.attrs.get("in_pairs"):  # a 1x1 conv over plane pairs of codes: panel pp's columns of each
                src, dst = b.add(b.sdiv(ex[0], i64(2)), b.mul(pp, i64(nr))), b.mul(slot, i64(kdim * nr))
                if p % nr:  # whole panels are read where they lie (emit_i8a_gemm `planes`)
                    with b.if_then(b.icmp_signed(">=", pp, i64(p // nr))):
                        copy_pairs(b, k2.ins[0], src, p, kdim // 2, S, dst, nr, nr, k2.vw, p - p // nr * nr)
                return
            if aq and pointwise:  # a whole panel of input planes: its codes straight from them
                with b.if_else(b.icmp_signed("<", pp, i64(p // nr))) as (whole, ragged):
                    with whole:
                        emit_quantize_panel(b, S, slot, kdim, nr, aq, isa, k2.vw,
                                            src=(k2.ins[0], b.add(ex[0], b.mul(pp, i64(nr))), p))
                    with ragged:
                        conv_pack_panel(b, k2, S, ex[0], pp, slot)
                        emit_quantize_panel(b, S, slot, kdim, nr, aq, isa, k2.vw)
                return
            if aq and im2col_codes(b, k2, pp, panel_codes(b, S, slot, kdim, nr, isa), nr, aq, isa):
                return
            conv_pack_panel(b, k2, S, ex[0], pp, slot)
            if aq:  # the panel's codes, in place
                emit_quantize_panel(b, S, slot, kdim, nr, aq, isa, k2.vw)

        def gemm_items(b, k2, t, ex, slot):
            rb, g_, xp0 = ex
            S = b.bitcast(k2.scratch, k2.ins[0].type)
            Aq = b.bitcast(k2.ins[1], I8.as_pointer())
            tile_epi = tile_epilogue_of(k2, rb, tile_epilogue)
            span = (t, b.add(t, i64(1)))
            if aq:
                store = pair_rows_store(b, k2, rb, isa) if k2.attrs.get("out_pairs") else None
                planes = None
                if k2.attrs.get("in_pairs"):
                    planes = (b.bitcast(k2.ins[0], code_type(isa).as_pointer()), b.sdiv(xp0, i64(2)), p)
                emit_i8a_gemm(b, Aq, b.mul(g_, i64(ocg)), oc, k2.scratch, k2.out, b.mul(rb, i64(p)), p, ocg, p,
                              kdim, k2.vw, aq, isa, None if store else tile_epi, span, panel_at=slot, store=store,
                              planes=planes)
            else:
                emit_q4a_gemm(b, Aq, b.mul(g_, i64(ocg)), S, k2.out, b.mul(rb, i64(p)), p, ocg, p, kdim, k2.vw,
                              tile_epi, items=span, panel_at=slot)
        conv_schedule(b, k, panels, row_blocks(ocg, k.vw), pack, gemm_items, xplane0,
                      [row_base, gi, xplane0], pairs=pairs_of(k, isa) if aq else None)
    if epi_all is not None and not tile_epilogue:  # (never with out_pairs: writes_pairs)
        whole_epilogue(b, k, 2)

EMITTERS = {"cuvil.matmul": k_matmul_q4, "cuvil.conv2d": k_conv2d_q4}
