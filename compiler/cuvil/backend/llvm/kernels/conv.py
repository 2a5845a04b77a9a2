"""cuvil.conv2d: the emitter dispatches on the kernel plan's form (select.py) to the
transposed, Winograd, depthwise or direct kernels, and is itself the column-panel
GEMM form: per (image, group), the im2col panels packed into scratch (a 1x1 conv's
whole panels read in place from its input planes) times the weight rows, the epilogue
on the tiles while they are in registers or cache.
"""
from __future__ import annotations

from contextlib import nullcontext

from ....errors import BackendError

from ..emit import REG_TYPES, i64, load, store
from ..gemm import (blocked_gemm, emit_gemm_blocked, emit_gemm_packed, emit_pack_b, emit_round_run,
                    panel_width, round_bf16, row_blocks)
from ..kernel_args import KernelArgs
from ..loops import for_range
from ..parallel import parallel
from ..vectors import zero_fill
from .conv_shapes import conv_geometry, padded_input, range_for_tap
from .conv_transposed import k_conv2d_transposed
from .depthwise import k_conv2d_depthwise, k_conv2d_depthwise_masked
from .epilogue import row_epilogue, tile_epilogue_of, whole_epilogue
from .im2col import im2col_panel, padded_copy
from .winograd import k_conv2d_winograd


# The conv2d forms of a kernel plan (backend/llvm/select.py) other than the column-panel GEMM.
OTHER_FORMS = {"depthwise": k_conv2d_depthwise, "depthwise_masked": k_conv2d_depthwise_masked,
               "winograd": k_conv2d_winograd, "transposed": k_conv2d_transposed}


# A GEMM convolution with at least this many panels packs each panel right before
# multiplying it (one parallel loop over panels); fewer panels are packed first, then
# the (panel, row block) items split across the threads.
FUSED_PACK_PANELS = 16


def k_conv2d(b, k: KernelArgs, weights=None, round_panel=False):
    """Convolution as GEMM: per (image, group), B (the input planes for 1x1 convs, the
    im2col matrix otherwise) is packed in panels into scratch, then C[OC, P] = W @ B; a
    1x1 conv's whole panels are read from its input planes in place.
    `weights(b, k2)`: W's pointer (default the operand; i16 for bfloat16 rows);
    `round_panel`: each packed panel is rounded to bfloat16 (`precision: bf16`)."""
    form = "gemm" if weights is not None else k.plan.get("form")
    if form in OTHER_FORMS:
        return OTHER_FORMS[form](b, k)
    if form != "gemm":
        raise BackendError(f"k_conv2d has no form {form!r}")
    xt, wt = k.in_types[:2]
    weights = weights or (lambda b, k2: k2.ins[1])
    rnd = round_bf16 if round_panel else None
    n, c, h, w = xt.shape
    oc, icg, kh, kw = wt.shape
    _, _, oh, ow = k.out_type.shape
    g = k.attrs["groups"]
    ocg, kdim, p = oc // g, icg * kh * kw, oh * ow
    ety = REG_TYPES[k.out_type.dtype]
    nr = panel_width(k.vw)
    panels = -(-p // nr)
    epi_all = row_epilogue(k, 2, 2)
    tile_epilogue = epi_all is not None and epi_all.supports_cols
    # A 1x1 conv's whole panels are its input planes' columns as they are: the tiles read
    # them in place, with no packing pass and no scratch to stream through; the K-blocked
    # GEMM (narrow vectors) reads packed panels only.
    in_place = conv_geometry(xt, wt, k.out_type, k.attrs)[0] and rnd is None and not blocked_gemm(ocg, p, k.vw)
    with for_range(b, n * g, name="ng") as ng:
        ni, gi = b.sdiv(ng, i64(g)), b.srem(ng, i64(g))
        xplane0 = b.mul(b.add(b.mul(ni, i64(c)), b.mul(gi, i64(icg))), i64(h * w))
        row_base = b.add(b.mul(ni, i64(oc)), b.mul(gi, i64(ocg)))

        def pack(b, k2, pp, ex, slot):
            with b.if_then(b.icmp_signed(">=", pp, i64(p // nr))) if in_place else nullcontext():  # only a ragged one
                conv_pack_panel(b, k2, b.bitcast(k2.scratch, k2.ins[0].type), ex[0], pp, slot, rnd)

        def gemm_items(b, k2, t, ex, slot):
            rb, g_, xp0 = ex
            S = b.bitcast(k2.scratch, k2.ins[0].type)
            epi = tile_epilogue_of(k2, rb, tile_epilogue)
            emit_gemm_packed(b, weights(b, k2), b.mul(g_, i64(ocg * kdim)), kdim, S, k2.out, b.mul(rb, i64(p)), p,
                             ocg, p, kdim, k2.vw, ety, epi, items=(t, b.add(t, i64(1))), panel_at=slot,
                             planes=(k2.ins[0], xp0, p) if in_place else None)

        def gemm_panels(b, k2, panels_, ex, slot):  # all weight rows times panels [p0, p1), K-blocked
            rb, g_ = ex[:2]
            S = b.bitcast(k2.scratch, k2.ins[0].type)
            epi = tile_epilogue_of(k2, rb, tile_epilogue)
            emit_gemm_blocked(b, weights(b, k2), b.mul(g_, i64(ocg * kdim)), kdim, S, k2.out, b.mul(rb, i64(p)), p,
                              ocg, p, kdim, k2.vw, ety, epi, panels=panels_, panel_at=slot)

        conv_schedule(b, k, panels, row_blocks(ocg, k.vw), pack, gemm_items, xplane0,
                      [row_base, gi, xplane0], gemm_panels if blocked_gemm(ocg, p, k.vw) else None, rnd)
    if epi_all is not None and not tile_epilogue:
        whole_epilogue(b, k, 2)


def conv_pack_panel(b, k2: KernelArgs, S, xplane0, pp, slot, rnd=None):
    """Panel pp of a GEMM conv's B operand into panel slot `slot` of S (f32): the input
    planes of a 1x1 conv (vector copies), else the im2col matrix (im2col_panel).
    `rnd(b, value)` (scalar or vector) maps the panel's values: as they are copied, or
    already in the padded input copy (conv_schedule's `rnd`), else after packing."""
    xt, wt = k2.in_types[:2]
    pointwise, _ = conv_geometry(xt, wt, k2.out_type, k2.attrs)
    kdim, p, nr = wt.shape[1] * wt.shape[2] * wt.shape[3], k2.out_type.shape[2] * k2.out_type.shape[3], \
        panel_width(k2.vw)
    if pointwise:
        emit_pack_b(b, k2.ins[0], xplane0, p, kdim, p, S, k2.vw, S.type.pointee, panels=(pp, b.add(pp, i64(1))),
                    slot=slot, value=rnd)
        return
    im2col_panel(b, k2, b.gep(S, [b.mul(slot, i64(kdim * nr))], inbounds=True), xplane0, pp, (0, nr))
    if rnd is not None and padded_input(xt, wt, k2.out_type, k2.attrs) is None:
        emit_round_run(b, S, S, b.mul(slot, i64(kdim * nr)), kdim * nr, k2.vw)


def conv_schedule(b, k: KernelArgs, panels: int, blocks: int, pack, gemm_items, xplane0, extras, gemm_panels=None,
                  rnd=None, pairs=None):
    """Run a GEMM conv's pack(b, k2, panel, [xplane0], slot) and gemm_items(b, k2, t,
    extras, slot) (t = panel * blocks + row block; the panel is packed at panel slot
    `slot` of the scratch) across the threads: with >= FUSED_PACK_PANELS panels each
    work item packs one panel and multiplies it by all the weight rows at once, while
    it is in cache, every panel of a thread's chunk in the same slot (the first of the
    chunk), by gemm_panels(b, k2, (panel, panel + 1), extras, slot) where given, else
    item by item; fewer panels are all packed first, each at its own slot, then split:
    gemm_panels(b, k2, (p0, p1), extras, None) on each thread's range of panels where
    given (K-blocked across them: a weight block is read from L2 for every panel of the
    range, not streamed once per panel), else the items.
    Convs of dilation 1 first copy their input planes zero-padded (padded_input), each
    value mapped by `rnd` where given, in plane pairs with `pairs` (padded_copy)."""
    xt, wt = k.in_types[:2]
    if padded_input(xt, wt, k.out_type, k.attrs) is not None:
        padded_copy(b, k, xplane0, rnd, pairs)
    if panels >= FUSED_PACK_PANELS:
        def pack_and_multiply(b, k2, pp, ex):
            slot = ex[-1]  # every panel of this thread's chunk goes through one slot, kept in cache
            pack(b, k2, pp, ex[:1], slot)
            if gemm_panels is not None:
                gemm_panels(b, k2, (pp, b.add(pp, i64(1))), ex[1:-1], slot)
                return
            with for_range(b, blocks, name="rb") as rb:
                gemm_items(b, k2, b.add(b.mul(pp, i64(blocks)), rb), ex[1:-1], slot)
        parallel(b, k, panels, pack_and_multiply, [xplane0, *extras], chunk_start=True)
    else:
        parallel(b, k, panels, lambda b, k2, pp, ex: pack(b, k2, pp, ex, pp), [xplane0])
        if gemm_panels is not None:  # each thread's range of panels, K-blocked across its panels
            parallel(b, k, panels, lambda b, k2, rng, ex: gemm_panels(b, k2, rng, ex, None), extras, ranges=True)
        else:
            parallel(b, k, blocks * panels, lambda b, k2, t, ex: gemm_items(b, k2, t, ex, None), extras)


def k_conv2d_direct(b, k: KernelArgs):
    xt, wt = k.in_types[:2]
    n, c, h, w = xt.shape
    oc, icg, kh, kw = wt.shape
    _, _, oh, ow = k.out_type.shape
    g = k.attrs["groups"]
    ocg = oc // g
    (sh, sw), (dh, dw), (pt, pl, _, _) = k.attrs["stride"], k.attrs["dilation"], k.attrs["pads"]
    dt = k.out_type.dtype
    pointwise = kh == kw == 1 and sh == sw == 1 and pt == pl == 0 and (oh, ow) == (h, w)

    def plane_body(b, k2, t, _):
        X, W, O = k2.ins[0], k2.ins[1], k2.out
        ni, o = b.sdiv(t, i64(oc)), b.srem(t, i64(oc))
        grp = b.sdiv(o, i64(ocg))
        plane = b.mul(b.add(b.mul(ni, i64(oc)), o), i64(oh * ow))
        zero_fill(b, O, plane, oh * ow, dt)
        with for_range(b, icg, name="ic") as icx:
            ch = b.add(b.mul(grp, i64(icg)), icx)
            xplane = b.mul(b.add(b.mul(ni, i64(c)), ch), i64(h * w))
            wbase = b.mul(b.add(b.mul(o, i64(icg)), icx), i64(kh * kw))
            if pointwise:
                wv = load(b, W, wbase, wt.dtype)
                with for_range(b, oh * ow, name="p") as p:
                    idx = b.add(plane, p)
                    acc = b.fadd(load(b, O, idx, dt), b.fmul(wv, load(b, X, b.add(xplane, p), dt),
                                                             flags=("contract",)), flags=("contract",))
                    store(b, acc, O, idx, dt)
            else:
                with for_range(b, kh, name="ky") as ky:
                    toff_h = b.sub(b.mul(ky, i64(dh)), i64(pt))
                    oh_lo, oh_hi = range_for_tap(b, toff_h, sh, h, oh)
                    with for_range(b, kw, name="kx") as kx:
                        toff_w = b.sub(b.mul(kx, i64(dw)), i64(pl))
                        ow_lo, ow_hi = range_for_tap(b, toff_w, sw, w, ow)
                        wv = load(b, W, b.add(wbase, b.add(b.mul(ky, i64(kw)), kx)), wt.dtype)
                        with for_range(b, oh_hi, start=oh_lo, name="y") as y:
                            iy = b.add(b.mul(y, i64(sh)), toff_h)
                            orow = b.add(plane, b.mul(y, i64(ow)))
                            xrow = b.add(b.add(xplane, b.mul(iy, i64(w))), toff_w)
                            with for_range(b, ow_hi, start=ow_lo, name="x") as x:
                                idx = b.add(orow, x)
                                xi = b.add(xrow, b.mul(x, i64(sw)))
                                acc = b.fadd(load(b, O, idx, dt), b.fmul(wv, load(b, X, xi, dt),
                                                                         flags=("contract",)), flags=("contract",))
                                store(b, acc, O, idx, dt)
    parallel(b, k, n * oc, plane_body)
    whole_epilogue(b, k, 2)


OTHER_FORMS["direct"] = k_conv2d_direct
