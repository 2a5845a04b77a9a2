"""bf16 convs of the bfloat16 dot product (vdpbf16ps): the transposed form that reads
each pixel's taps straight from a padded copy of plane pairs (k_conv2d_bf16_transposed,
gather_at), the copies as pairs of codes (im2col_codes, copy_pairs), the stores of a
result as pairs (pair_rows_store) and which results are stored as pairs (stored_pairs,
the rule select.SelectStorage applies; see quantized.py's docstring for the whole
picture).
"""
from __future__ import annotations

from dataclasses import replace
from math import gcd

from llvmlite import ir
import numpy as np

from ....ir.ops.quant import rounds_to_bf16
from ..emit import F32, I8, i64
from ..gemm import packed_work_items, panel_width, vec_ptr
from ..gemm_dot import Gather, I16, I32, code_type, emit_i8b_gemm, emit_quantize_block, store_group
from ..kernel_args import KernelArgs
from ..loops import for_range
from ..target import masked_lanes
from ..vectors import index_div, load_lanes, store_lanes
from .bf16_codes import pair_codes
from .conv_shapes import conv_geometry, padded_column, padded_input, thin_panels
from .conv_transposed import Transposed, run_transposed, transposed_store
from .epilogue import op_epilogue, pairs_epilogue, row_epilogue
from .im2col import im2col_panel, padded_base, padded_reader
from .schemes import quantized_weight


def bf16_transposed_shape(x, w, out, attrs) -> bool:
    """A bf16 conv whose types allow the transposed form: static shapes, one group, a
    GEMM-shaped f32 conv."""
    if not all(isinstance(v, int) for v in (*x.shape, *w.shape, *out.shape)) or attrs["groups"] != 1:
        return False
    return out.dtype == "f32" and conv_geometry(x, w, out, attrs)[1]


def bf16_transposable(op) -> bool:
    """Whether op is a bf16 conv that runs transposed on some target (the memory plan
    reserves that form's scratch too)."""
    return (op.name == "cuvil.conv2d" and quantized_weight(op) == "bf16"
            and bf16_transposed_shape(op.operands[0].type, op.operands[1].type, op.result.type, op.attrs))


def bf16_transposed(x, w, out, attrs, vw: int, isa) -> bool:
    """Whether a bf16 conv runs k_conv2d_bf16_transposed: with the bf16 dot product, where
    its output planes fill the column panels poorly (conv_shapes.thin_panels: 7x7 and 14x14
    planes), like an f32 conv_transposed one, and wherever its input is copied as plane
    pairs (pair_planes): the GEMM then reads that copy with no im2col at all (gather_at),
    which beats the column-panel form even on large planes."""
    return isa.dot == "dpbf16ps" and bf16_transposed_shape(x, w, out, attrs) and \
        (thin_panels(out, vw) or pair_planes(x, w, out, attrs, isa, vw))


def pair_planes(x, w, out, attrs, isa, vw: int) -> bool:
    """Whether a bf16 conv with the bf16 dot product copies its padded input as plane
    pairs of codes (im2col.padded_copy `pairs`: each element the bf16 codes of input
    planes 2i and 2i + 1): an even number of input channels per group, a padded copy.
    Its weight rows then run over K in (pair, tap, channel of the pair) order
    (pair_order), so each im2col group row is one tap of one pair: a 32-bit copy from
    the padded pairs, converted once per input value instead of once per tap. (Masked
    vectors: the pairs' copy has no column-by-column form.)"""
    return isa.dot == "dpbf16ps" and masked_lanes(vw) and w.shape[1] % 2 == 0 \
        and padded_input(x, w, out, attrs) is not None


def pair_order(rows: np.ndarray, icg: int, taps: int) -> np.ndarray:
    """A conv weight's rows [C, K * B] (K = icg * taps values of B bytes, in (channel,
    tap) order) with K in (channel pair, tap, channel of the pair) order (pair_planes)."""
    c = rows.shape[0]
    v = rows.reshape(c, icg // 2, 2, taps, -1).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(v).reshape(c, -1)


def pairs_conv(op, isa, vw: int) -> bool:
    """A bf16 conv of the bf16 dot product on masked vectors whose types allow the
    transposed form (static, one group, GEMM-shaped, f32): the convs that may store
    their result, or read their input, as plane pairs of codes (stored_pairs)."""
    if op.name != "cuvil.conv2d" or quantized_weight(op) != "bf16" or isa.dot != "dpbf16ps" or not masked_lanes(vw):
        return False
    aq = op.attrs.get("act_quant")
    return bool(aq) and aq["dtype"] == "bf16" and \
        bf16_transposed_shape(op.operands[0].type, op.operands[1].type, op.result.type, op.attrs)


def writes_pairs(op, isa, vw: int) -> bool:
    """Whether op's kernel can store its result as plane pairs of codes (`out_pairs`):
    a pairs_conv with an even channel count whose epilogue, if any, runs on vectors
    (`apply`; a transposed one's tiles then go by channel, transposed_store), column-panel
    ones over whole vectors of pixels."""
    return pairs_conv(op, isa, vw) and op.operands[1].type.shape[0] % 2 == 0 and vector_tiles(op, isa, vw)


def vector_tiles(op, isa, vw: int, epilogue: bool = False) -> bool:
    """Whether op's epilogue (required with `epilogue`), if any, runs on vectors
    (`apply`) and its tiles hold whole vectors of its planes: it runs transposed, or its
    planes are whole vectors of pixels (column-panel tiles take the epilogue in
    registers only over whole vectors, kernels.tile_post)."""
    epi = op_epilogue(op)
    if (epi is None and epilogue) or (epi is not None and epi.apply is None):
        return False
    x, w, out = op.operands[0].type, op.operands[1].type, op.result.type
    return bf16_transposed(x, w, out, op.attrs, vw, isa) or out.shape[2] * out.shape[3] % vw == 0


def reads_pairs_extra(op, v, isa, vw: int) -> bool:
    """Whether op's kernel can read value v, one of its epilogue's operands (a residual),
    as plane pairs of codes (`pairs_extras`): a pairs_conv with an epilogue on vectors
    over whole vectors of its planes (vector_tiles), v of the result's shape and never
    op's input or weight."""
    return pairs_conv(op, isa, vw) and all(u is not v for u in op.operands[:2]) and \
        tuple(v.type.shape) == tuple(op.result.type.shape) and vector_tiles(op, isa, vw, epilogue=True)


def bf16_exact(op) -> bool:
    """Whether op's result is a bf16 value: its epilogue ends rounding to bfloat16
    (passes/quantize_bf16.rounds_result)."""
    return rounds_to_bf16(op.attrs.get("post") or [])


def reads_pairs(op, isa, vw: int) -> bool:
    """Whether op's kernel can read its input (operand 0) as plane pairs of codes
    (`in_pairs`): a pairs_conv over an even channel count that is a 1x1 conv (its GEMM
    then reads the pairs in place as its panels' codes) or copies its input padded as
    pairs (pair_planes: the copy is then of the pairs as they are)."""
    if not pairs_conv(op, isa, vw):
        return False
    x, w, out = op.operands[0].type, op.operands[1].type, op.result.type
    return x.shape[1] % 2 == 0 and (conv_geometry(x, w, out, op.attrs)[0] or pair_planes(x, w, out, op.attrs, isa, vw))


def passes_pairs(op) -> bool:
    """Whether op can take plane pairs of codes and give pairs: over a static NCHW f32
    tensor of an even number of channels, a slice that keeps them all (the subsampling
    that canonicalize puts before a strided 1x1 conv; run on the pairs as a slice of
    half the planes of 32-bit elements), or a max pool whose windows all overlap the
    image (pooling._max_pool_clamped: each code pair widened, maxed apart, joined). The
    max of values rounded to bf16 is the rounded max (rounding is monotonic) but for
    the sign of a zero: the pool's readers, convs rounding their input, see the same."""
    if op.name not in ("cuvil.slice", "cuvil.max_pool2d"):
        return False
    x, out = op.operands[0].type, op.result.type
    if x.rank != 4 or x.dtype != "f32" or not all(isinstance(d, int) for d in (*x.shape, *out.shape)):
        return False
    if x.shape[1] % 2 or out.shape[1] != x.shape[1]:
        return False
    if op.name == "cuvil.slice":
        return op.attrs["starts"][1] == 0 and op.attrs["steps"][1] == 1
    (kh, kw), (pt, pl, pb, pr) = op.attrs["kernel"], op.attrs["pads"]
    return tuple(op.attrs.get("dilation", [1, 1])) == (1, 1) and max(pt, pb) < kh and max(pl, pr) < kw


def pairs_view(name: str, types, attrs):
    """(types, attrs) of a passes_pairs op's kernel over plane pairs: its result and
    input as half the planes of 32-bit elements (a slice's channel end too)."""
    types = [replace(t, shape=(t.shape[0], t.shape[1] // 2, *t.shape[2:])) for t in types]
    if name == "cuvil.slice":
        attrs = {**attrs, "ends": [attrs["ends"][0], types[0].shape[1], *attrs["ends"][2:]]}
    return types, attrs


def stored_pairs(ops, outputs, isa, vw: int, fused=frozenset()) -> set[int]:
    """The ids of the ops whose results are stored as plane pairs of codes: result
    [N][C/2][H*W][2] (bf16 codes of planes 2i and 2i + 1 in each 32-bit element), half
    the f32 bytes. An op writes_pairs, it is no output (`outputs`: value ids), neither it
    nor a user runs fused into another kernel (`fused`: op ids), and every user is a conv
    that reads_pairs it as its operand 0, or, where the result is a bf16 value anyway
    (bf16_exact), reads_pairs_extra it in its epilogue (a residual), or a slice or max
    pool that passes_pairs to such users (its result is pairs too). A conv planned to
    write over its residual (the memory plan's in-place convs) stores pairs exactly when
    that residual is pairs (the two layouts differ): such pairs are dropped together.
    The convs reading their input round it to bf16 codes anyway, so nothing changes in
    the numbers; the pairs skip that pass and half the bytes, where the result is
    written and where each user reads it (a 1x1 user's whole panels in place). The gain
    grows with the residual stream stored as pairs too (with the in-place convs, the
    projections' slices and the stem's pool)."""

    def through(r, exact):
        """The slices and pools that pass r's pairs on, if every reader of r takes pairs
        (`exact`: r holds bf16 values, so an epilogue may read it too), else None."""
        found = []
        for u in r.uses:
            slots = {i for i, v in enumerate(u.operands) if v is r}
            if id(u) in fused or 1 in slots:
                return None
            if slots == {0} and passes_pairs(u) and id(u.result) not in outputs and u.result.uses:
                more = through(u.result, exact)
                if more is None:
                    return None
                found += [u, *more]
            elif not (reads_pairs(u, isa, vw) if slots == {0} else exact and reads_pairs_extra(u, r, isa, vw)):
                return None  # (an extra-reader never has r as its input too)
        return found

    chosen, tied = set(), []  # tied: ops stored as pairs together or not at all
    for op in ops:
        if not writes_pairs(op, isa, vw) or id(op) in fused or id(op.result) in outputs or not op.result.uses:
            continue
        passing = through(op.result, bf16_exact(op))
        if passing is not None:
            chosen |= {id(o) for o in (op, *passing)}
            tied += [(op, o) for o in passing]
    for op in ops:  # a conv planned over its residual
        spot = op.attrs.get("arena_offset")
        if op.name == "cuvil.conv2d" and spot is not None:
            tied += [(op, v.defining_op) for v in op.operands[2:]
                     if v.defining_op is not None and v.defining_op.attrs.get("arena_offset") == spot]
    changed = True
    while changed:
        changed = False
        for a, b in tied:
            if (id(a) in chosen) != (id(b) in chosen):
                chosen -= {id(a), id(b)}
                changed = True
    return chosen


def pairs_of(k2: KernelArgs, isa):
    """padded_copy's `pairs` for this conv, or None."""
    xt, wt = k2.in_types[:2]
    if not pair_planes(xt, wt, k2.out_type, k2.attrs, isa, k2.vw):
        return None
    return lambda b, v0, v1: pair_codes(b, v0, v1, isa)


def im2col_codes(b, k2: KernelArgs, pp, out, ldo, aq, isa) -> bool:
    """Panel pp's im2col columns as [Kg][.][G] codes at out (group row kg's from kg *
    ldo positions), read straight from the conv's padded input copy (no f32 panel);
    False (nothing emitted) where the conv has no padded copy. From plane pairs of codes
    (pair_planes), each group row is a copy of 32-bit elements. From f32 planes, the rows
    go in blocks of whole groups and whole input channels (lcm(G, kh * kw) rows),
    unrolled, so every row's place in the copy is a constant offset from its block's."""
    xt, wt = k2.in_types[:2]
    padded = padded_input(xt, wt, k2.out_type, k2.attrs)
    if padded is None:
        return False
    _, icg, kh, kw = wt.shape
    hp, sw, wq = padded
    g, taps = isa.group, kh * kw
    read = padded_reader(b, k2, pp)
    chunks = panel_width(k2.vw) // k2.vw

    pitch = hp * sw * wq  # elements per plane (or pair of planes) of the copy

    def tap_at(plane: int, t: int) -> int:  # tap t of a plane: its first element in the copy
        ky, kx = divmod(t, kw)
        return plane * pitch + ky * sw * wq + padded_column(padded, kx)

    if pair_planes(xt, wt, k2.out_type, k2.attrs, isa, k2.vw):
        wty = ir.VectorType(code_type(isa), 2 * k2.vw)
        with for_range(b, icg // 2, name="pair") as pair:
            base = b.mul(pair, i64(pitch))
            for t in range(taps):
                kg = b.add(b.mul(pair, i64(taps)), i64(t))
                for c in range(chunks):
                    at = b.mul(b.add(b.mul(kg, i64(ldo)), i64(c * k2.vw)), i64(2))
                    b.store(b.bitcast(read(b, b.add(base, i64(tap_at(0, t))), c), wty), vec_ptr(b, out, at, wty),
                            align=1)
        return True

    per = taps * g // gcd(taps, g)  # rows of a block

    def tap(j):  # row j of a block: its first element in the copy, from the block's
        return tap_at(*divmod(j, taps))

    def groups_from(base, kg0, rows):  # rows of a block from padded element base, group row kg0
        for gi in range(-(-rows // g)):
            for c in range(chunks):
                xs = [read(b, b.add(base, i64(tap(j))), c) for j in range(gi * g, min(rows, gi * g + g))]
                store_group(b, xs, out, b.add(b.mul(b.add(kg0, i64(gi)), i64(ldo)), i64(c * k2.vw)), aq, isa, k2.vw)

    block_elems = per // taps * pitch
    whole = icg * taps // per
    with for_range(b, whole, name="blk") as blk:
        groups_from(b.mul(blk, i64(block_elems)), b.mul(blk, i64(per // g)), per)
    if icg * taps % per:
        groups_from(i64(whole * block_elems), i64(whole * per // g), icg * taps % per)
    return True


def copy_pairs(b, X, src, ld, rows: int, out, dst, ldo, width: int, vw: int, left=None):
    """Rows of plane pairs of codes (32-bit elements of X, an f32 pointer: row r's
    `width` elements from src + r * ld) into out (f32 pointer, row r from dst + r * ldo):
    the ragged last panel of a 1x1 conv over pairs (`in_pairs`; its whole panels are
    read in place), as group rows. `left` (an
    int): only that many leading elements of each row are read, the rest are zeros (a
    ragged last panel: nothing past the pairs is read)."""
    fv = ir.VectorType(F32, vw)
    with for_range(b, rows, name="pr") as r:
        at, to = b.add(src, b.mul(r, i64(ld))), b.add(dst, b.mul(r, i64(ldo)))
        for c in range(width // vw):
            ptr = b.bitcast(b.gep(X, [b.add(at, i64(c * vw))], inbounds=True), fv.as_pointer())
            got = b.load(ptr, align=4) if left is None else \
                load_lanes(b, ptr, fv, [c * vw + j < left for j in range(vw)])
            b.store(got, b.bitcast(b.gep(out, [b.add(to, i64(c * vw))], inbounds=True), fv.as_pointer()), align=4)


def pair_rows_store(b, k2: KernelArgs, rb, isa):
    """For a column-panel bf16 conv that stores its result as plane pairs of codes
    (`out_pairs`): emit_i8a_gemm's store(b, row0, rows, col0, valid, vals) for the tiles
    of the image whose result rows start at rb (i64). Rows 2i and 2i + 1 of a tile (an
    even row0 and count: the channels of a pair) take the epilogue in registers, then go
    as one vector of pair codes per vw pixels; a ragged panel's last vector is masked."""
    p, vw = k2.out_type.shape[2] * k2.out_type.shape[3], k2.vw
    fv = ir.VectorType(F32, vw)
    epi = pairs_epilogue(k2)

    def store(b, row0, rows, col0, valid, vals):
        for r in range(0, rows, 2):
            ch = b.add(rb, b.add(row0, i64(r)))
            for v in range(len(vals[r])):
                col = b.add(col0, i64(v * vw))
                v0, v1 = vals[r][v], vals[r + 1][v]
                n = vw if valid is None else min(vw, valid - v * vw)
                if epi is not None:  # (a residual's lanes past a ragged panel are not read)
                    lanes = None if n == vw else n
                    v0, v1 = epi.apply(b, ch, col, v0, lanes, 0), epi.apply(b, b.add(ch, i64(1)), col, v1, lanes, 1)
                at = b.add(b.mul(index_div(b, ch, 2), i64(p)), col)
                ptr = b.bitcast(b.gep(k2.out, [at], inbounds=True), fv.as_pointer())
                if n == vw:
                    b.store(pair_codes(b, v0, v1, isa), ptr, align=4)
                else:
                    store_lanes(b, pair_codes(b, v0, v1, isa), ptr, n)
    return store


def k_conv2d_bf16_transposed(b, k: KernelArgs):
    """A bf16 conv as C^T[P, OC] = im2col^T @ W^T (conv_transposed.k_conv2d_transposed's form),
    per image: im2col^T's K rows of P (padded to whole panels; a 1x1 conv reads its input
    planes) become [Kg][P'][2] codes, a panel of columns per work item (im2col_codes;
    without a padded copy, in place after the f32 pack), or, over plane pairs of codes,
    are read where they lie in the pairs (gather_at); the bf16 GEMM (emit_i8b_gemm)
    multiplies them by the weight's W^T panels (gemm_dot.bf16_blob, packed). Each tile is
    transposed in registers into the NCHW result, with an epilogue that runs on its
    vectors; another epilogue has the tiles go to C^T in scratch, transposed into the
    result with it afterwards.
    The weight streams once per call, spread over the threads' output-channel panels,
    where the column panels would read it once per pixel panel."""
    t = Transposed.of(k, codes=True)
    oc, p, kdim, nr, vw = k.out_type.shape[1], t.p, t.kdim, t.nr, k.vw
    ldk = t.panels * nr  # positions per row of im2col^T and per group row of its codes
    epi_all = row_epilogue(k, 2, 2)
    aq, isa = k.attrs["act_quant"], k.bf16
    fv = ir.VectorType(F32, vw)

    def scratch(b, k2):
        return b.bitcast(k2.scratch, F32.as_pointer())

    def codes_at(b, k2, col):  # group row 0's position col of the codes, over the f32 rows
        return b.bitcast(b.gep(scratch(b, k2), [col], inbounds=True), I16.as_pointer())

    def pack(b, k2, pp, ex):  # panel pp's columns of every row as codes
        col = b.mul(pp, i64(nr))
        if im2col_codes(b, k2, pp, codes_at(b, k2, col), ldk, aq, isa):
            return
        im2col_panel(b, k2, scratch(b, k2), ex[0], pp, (nr, ldk))
        emit_quantize_block(b, scratch(b, k2), col, ldk, kdim, codes_at(b, k2, col), ldk, nr, aq, isa, vw)

    def quantize_input(b, k2, pp, ex):  # a 1x1 conv: panel pp's columns of the input planes
        col = b.mul(pp, i64(nr))
        src = b.add(ex[0], col)
        whole = p // nr
        with b.if_else(b.icmp_signed("<", pp, i64(whole))) as (full, ragged):
            with full:
                emit_quantize_block(b, k2.ins[0], src, p, kdim, codes_at(b, k2, col), ldk, nr, aq, isa, vw)
            with ragged:  # the last panel's columns past P read as zeros, not from past the planes
                left = p - whole * nr

                def masked(b, at, ci):
                    ptr = b.bitcast(b.gep(k2.ins[0], [at], inbounds=True), fv.as_pointer())
                    return load_lanes(b, ptr, fv, [ci * vw + j < left for j in range(vw)])
                emit_quantize_block(b, k2.ins[0], src, p, kdim, codes_at(b, k2, col), ldk, nr, aq, isa, vw,
                                    load=masked)

    # Without an epilogue, or one that runs on vectors (a bias, an activation, a
    # residual: read only in the tile's pixels), each tile is transposed in registers and
    # stored into the result (its rows' pixels in the first lanes of each channel's
    # vector), with no C^T and no pass of its own (with a residual too: a small gain per
    # conv).
    direct = epi_all is None or epi_all.apply is not None

    # From plane pairs of codes, the GEMM reads its A groups there (tile row m's pixel
    # plus the tap's offset: gather_at) and no im2col^T is built.
    pairs = pairs_of(k, isa)
    gathered = pairs is not None and not t.pointwise
    # A 1x1 conv over plane pairs of codes (`in_pairs`): they are im2col^T's codes
    # already ([Kg][P][2]); the GEMM reads them where they lie, rows of P positions (its
    # last row block exactly as short as P leaves it: nothing past the pairs is read).
    in_place = t.pointwise and k.attrs.get("in_pairs")

    def gemm(b, k2, i, ex):
        Ct = b.gep(scratch(b, k2), [i64(t.ct_at)], inbounds=True)
        q = b.bitcast(scratch(b, k2), I16.as_pointer())
        if in_place:  # image ni's pairs: its f32 planes' offset, in codes
            q = b.gep(b.bitcast(k2.ins[0], I16.as_pointer()), [ex[0]], inbounds=True)
        store = transposed_store(b, k2, ex[1], isa if k2.attrs.get("out_pairs") else None) if direct else None
        emit_i8b_gemm(b, None if gathered else q, None, kdim, b.bitcast(k2.ins[1], I8.as_pointer()), Ct, t.ldct, p,
                      oc, kdim, vw, aq, isa, None, (i, b.add(i, i64(1))), q_pitch=p if in_place else ldk, store=store,
                      gather=gather_at(b, k2) if gathered else None)

    prepare = None if gathered or in_place else (t.panels, quantize_input if t.pointwise else pack)
    run_transposed(b, k, t, prepare, (packed_work_items(p, oc, vw), gemm), direct, pairs)


def gather_at(b, k2: KernelArgs) -> Gather:
    """Where a conv's im2col^T groups lie in its padded copy of plane pairs of codes
    (pair_planes; K in (pair, tap) order): output pixel m = (y, x) reads tap (ky, kx) of
    pair j at j * pitch + (sh * y + ky) * row + kx's column (padded_column), row the
    elements of a padded row (its sw phases)."""
    xt, wt = k2.in_types[:2]
    hp, sw, wq = padded = padded_input(xt, wt, k2.out_type, k2.attrs)
    _, _, kh, kw = wt.shape
    ow, sh = k2.out_type.shape[3], k2.attrs["stride"][0]

    def row_at(b, m):
        return b.add(b.mul(b.sdiv(m, i64(ow)), i64(sh * sw * wq)), b.srem(m, i64(ow)))
    taps = tuple(ky * sw * wq + padded_column(padded, kx) for ky in range(kh) for kx in range(kw))
    return Gather(b.bitcast(padded_base(b, k2), I32.as_pointer()), row_at, hp * sw * wq, taps)
