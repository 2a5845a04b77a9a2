"""Epilogues: an op's post program (bias, residual, activation) on its result, whole
or by rows while a GEMM's tiles are in cache (RowEpilogue)."""
from __future__ import annotations

from dataclasses import replace
from math import prod

from llvmlite import ir

from ....errors import BackendError
from ....ir.ops.quant import rounds_to_bf16
from ..emit import (F32, REG_TYPES, View, broadcast_strides, coalesce, const_like, contiguous_strides,
                    emit_program, i64, load, loop_nest, store, vector_step)
from ..gemm import splat
from ..kernel_args import KernelArgs
from ..loops import for_range
from ..parallel import flat_offsets
from ..vectors import index_div, index_rem, load_lanes, pair_half
from .elementwise import emit_elementwise


def whole_epilogue(b, k: KernelArgs, n_main: int):
    """Apply the post program to the whole result in place (after a direct kernel)."""
    post = k.attrs.get("post") or []
    if post:
        consts = {i - n_main: v for i, v in k.consts.items() if i >= n_main}
        emit_elementwise(b, k.out, k.out_type, k.ins[n_main:], k.in_types[n_main:], consts, post,
                         first_is_out=True)


def row_epilogue(k: KernelArgs, n_main: int, split: int) -> "RowEpilogue | None":
    """k's post program as a RowEpilogue over rows of the first `split` dims, its extra
    operands from operand n_main on; None when there is no post program."""
    return RowEpilogue(k, n_main, split) if k.attrs.get("post") else None


class RowEpilogue:
    """An epilogue for GEMM row blocks: the result is viewed as rows (the first `split`
    dims, flattened) x columns (the rest); called as `epi(b, row0, rows, col0, cols)`,
    rows [row0, row0+rows) (only those flattened columns, with col0 / cols) get the post
    program in place while they are in cache.

    `apply(b, row, col, vec)` runs it on a tile's accumulators in registers where the
    program and operands allow whole vectors (else `apply` is None); `apply_rows` on a
    vector whose lanes are consecutive rows where `in_registers`. `supports_cols`: the
    columns flatten to one dim (calls may name columns).

    An extra operand that `pairs_extras` (k.attrs: operand indices) names is a bf16 conv
    result stored as plane pairs of codes (bf16.stored_pairs), of the result's shape:
    flat row r's value at column c is the code in 32-bit element (r // 2) * cols + c, its
    low half for an even r, its high one for an odd; only the vector paths (`apply`) read
    such an operand."""

    def __init__(self, k: KernelArgs, n_main: int, split: int):
        self.k, self.post, self.split = k, k.attrs.get("post") or [], split
        shape = list(k.out_type.shape)
        self.row_dims, self.col_dims = shape[:split], shape[split:]
        self.consts = {i - n_main: v for i, v in k.consts.items() if i >= n_main}
        kept = [i for i in range(len(k.in_types) - n_main) if i not in self.consts]  # the extras with a pointer
        extras = [(k.ins[n_main + i], k.in_types[n_main + i]) for i in kept]
        self.paired = {1 + kept.index(o - n_main) for o in k.attrs.get("pairs_extras") or ()
                       if o - n_main in kept}  # their places in ptrs
        if self.paired and (split != 2 or any(tuple(extras[j - 1][1].shape) != tuple(shape) for j in self.paired)):
            raise BackendError("an epilogue operand stored as plane pairs needs the result's shape and NCHW rows")
        self.n_cols = prod(shape[split:])
        self.strides = [contiguous_strides(shape)] + [broadcast_strides(t.shape, shape) for _, t in extras]
        self.ptrs = [k.out] + [p for p, _ in extras]
        self.dtypes = [k.out_type.dtype] + [t.dtype for _, t in extras]
        self.all_types = [t.dtype for t in k.in_types[n_main:]]
        self.flat_cols, self.flat_strides = coalesce(list(self.col_dims), [st[split:] for st in self.strides])
        self.supports_cols = len(self.flat_cols) == 1
        # tiles take whole vectors when every operand is f32 and either walks the columns
        # contiguously or is one value per row (a bias), and the program vectorises
        self.vector_cols = (self.supports_cols and all(dt == "f32" for dt in self.dtypes + self.all_types)
                            and all(fs[0] in (0, 1) for fs in self.flat_strides)
                            and all(vector_step(op, attrs) for op, _, attrs in self.post))
        # apply may take whole vectors anywhere in a row, lanes past its end included:
        # every extra operand is one value per row (a bias; not one stored as pairs, even
        # of 1x1 planes: apply_rows reads no pairs)
        self.in_registers = self.vector_cols and not self.paired and all(fs[0] == 0 for fs in self.flat_strides[1:])
        self.apply = self._apply if self.vector_cols else None

    def values_of(self, b, loaded):
        """The program's operand list: the result, then each extra operand (loaded) or constant."""
        vals, vi = [loaded[0]], 1
        for i, t in enumerate(self.all_types):
            if i in self.consts:
                c = self.consts[i]
                vals.append(const_like(loaded[0], t, c) if t in ("f32", "f16", "f64")
                            else ir.Constant(REG_TYPES[t], int(c)))
            else:
                vals.append(loaded[vi])
                vi += 1
        return vals

    def row_offsets(self, b, r):
        """Each operand's element offset of flat row r (of a pairs operand: (its 32-bit
        element offset, the shift that brings r's half down, i32))."""
        offs = flat_offsets(b, r, self.row_dims, [st[:self.split] for st in self.strides])
        for j in self.paired:
            offs[j] = (b.mul(index_div(b, r, 2), i64(self.n_cols)),
                       b.trunc(b.mul(index_rem(b, r, 2), i64(16)), ir.IntType(32)))
        return offs

    def load_pairs(self, b, j, off, col, vty, lanes, half=None):
        """The f32 values of pairs operand j at columns from col (off: row_offsets'); `half`
        (0, 1): the row's parity where it is known."""
        ptr = b.bitcast(b.gep(self.ptrs[j], [b.add(off[0], col)], inbounds=True), vty.as_pointer())
        got = load_lanes(b, ptr, vty, [lanes is None or e < lanes for e in range(vty.count)])
        if half is not None:
            return pair_half(b, got, half)
        ity = ir.VectorType(ir.IntType(32), vty.count)  # the row's half brought down to the low code
        one = b.insert_element(ir.Constant(ity, ir.Undefined), off[1], ir.Constant(ir.IntType(32), 0))
        shift = b.shuffle_vector(one, ir.Constant(ity, ir.Undefined), ir.Constant(ity, [0] * vty.count))
        return pair_half(b, b.bitcast(b.lshr(b.bitcast(got, ity), shift), vty), 0)

    def apply_at(self, b, offs, col, vec, lanes=None, half=None):
        """The program on vec, the result's vector at columns from col of the row whose
        operand offsets are offs: each extra operand is a vector there (only its first
        `lanes` elements read, where given) or, one value per row, a splat. `half`: the
        row's parity, where known (for a pairs operand)."""
        vty, ptrs, fss = vec.type, self.ptrs, self.flat_strides
        at = [None if j in self.paired else b.add(o, b.mul(col, i64(fs[0]))) if fs[0] else o
              for j, (o, fs) in enumerate(zip(offs, fss))]
        loaded = [vec] + [
            self.load_pairs(b, j, offs[j], col, vty, lanes, half) if j in self.paired else
            splat(b, load(b, ptrs[j], at[j], "f32"), vty) if fss[j][0] == 0 else
            load_lanes(b, b.bitcast(b.gep(ptrs[j], [at[j]], inbounds=True), vty.as_pointer()), vty,
                       [lanes is None or e < lanes for e in range(vty.count)])
            for j in range(1, len(ptrs))]
        res, _ = emit_program(b, self.post, self.values_of(b, loaded), ["f32"] + self.all_types)
        return res

    def _apply(self, b, r, col, vec, lanes=None, half=None):
        """apply_at for flat row r: a tile's accumulators, in registers. `lanes`: only the
        first that many columns are real (the extra operands read no further); `half`:
        r % 2, where the caller knows it."""
        return self.apply_at(b, self.row_offsets(b, r), col, vec, lanes, half)

    def apply_rows(self, b, r0, vec, lanes=None):
        """The program on vec whose lanes are flat rows r0, r0 + 1, .. of one column
        (the first `lanes` of them real): for an epilogue in_registers, each extra
        operand's value per row read as a vector over the rows where they lie one apart
        (a bias over channels), else row by row."""
        vty, n = vec.type, vec.type.count
        real = n if lanes is None else lanes
        assert self.in_registers, "apply_rows: an epilogue in registers (no pairs operand, one value per row)"
        offs = self.row_offsets(b, r0)
        loaded = [vec]
        for j in range(1, len(self.ptrs)):
            if self.strides[j][self.split - 1] == 1:
                ptr = b.bitcast(b.gep(self.ptrs[j], [offs[j]], inbounds=True), vty.as_pointer())
                loaded.append(load_lanes(b, ptr, vty, [e < real for e in range(n)]))
                continue
            got = ir.Constant(vty, [0.0] * n)
            for e in range(real):
                at = self.row_offsets(b, b.add(r0, i64(e)))[j]
                got = b.insert_element(got, load(b, self.ptrs[j], at, "f32"), ir.Constant(ir.IntType(32), e))
            loaded.append(got)
        res, _ = emit_program(b, self.post, self.values_of(b, loaded), ["f32"] + self.all_types)
        return res

    def vector_row(self, b, offs, col0, cols):
        """One row's whole vectors of columns from col0 (cols an int), in place; returns
        how many columns that covered."""
        vw = self.k.vw
        vty = ir.VectorType(F32, vw)
        whole = cols // vw
        for v in range(whole):
            col = b.add(col0, i64(v * vw))
            ptr = b.bitcast(b.gep(self.ptrs[0], [b.add(offs[0], col)], inbounds=True), vty.as_pointer())
            b.store(self.apply_at(b, offs, col, b.load(ptr, align=4)), ptr, align=4)
        return whole * vw

    def __call__(self, b, row0, rows, col0=None, cols=None):
        """Rows [row0, row0+rows); with col0/cols, only those (flattened) columns."""
        vec = self.vector_cols and col0 is not None and isinstance(cols, int) and cols >= self.k.vw
        with for_range(b, rows, name="er") as rr:
            offs = self.row_offsets(b, b.add(row0, rr))
            if not vec:
                self.by_element(b, offs, col0, cols)
            else:
                done = self.vector_row(b, offs, col0, cols)
                if done < cols:
                    self.by_element(b, offs, b.add(col0, i64(done)), cols - done)

    def by_element(self, b, offs, col0, cols):
        """One row (offs: its offset per operand): all its columns, or [col0, col0+cols)."""
        if self.paired:
            raise BackendError("an epilogue operand stored as plane pairs is read by whole vectors only "
                               "(bf16.stored_pairs)")
        k = self.k
        if col0 is None:
            views = [View(p, dt, st[self.split:], o) for p, dt, st, o in zip(self.ptrs, self.dtypes, self.strides, offs)]
            nest = self.col_dims
        else:
            views = [View(p, dt, [fs[0]], b.add(o, b.mul(col0, i64(fs[0]))) if fs[0] else o)
                     for p, dt, fs, o in zip(self.ptrs, self.dtypes, self.flat_strides, offs)]
            nest = [cols]

        def body(b, idx):
            loaded = [load(b, v.ptr, i, v.dtype) for v, i in zip(views, idx)]
            res, _ = emit_program(b, self.post, self.values_of(b, loaded), [k.out_type.dtype] + self.all_types)
            store(b, res, k.out, idx[0], k.out_type.dtype)
        loop_nest(b, nest, views, body)


def pairs_epilogue(k2: KernelArgs):
    """The row_epilogue of a conv that stores plane pairs of codes (`out_pairs`), less a
    last rounding to bfloat16 (quantize_bf16.rounds_result): the codes are that rounding."""
    post = k2.attrs.get("post") or []
    if rounds_to_bf16(post):
        k2 = replace(k2, attrs={**k2.attrs, "post": post[:-1]})
    return row_epilogue(k2, 2, 2)


def op_epilogue(op):
    """The row_epilogue op's GEMM kernel builds, from its types and attrs alone (no
    pointers: for what it supports, not to emit), or None without a post program."""
    return row_epilogue(KernelArgs(out=None, out_type=op.result.type, ins=[None] * len(op.operands),
                                    in_types=[v.type for v in op.operands], attrs=op.attrs), 2, 2)


def tile_epilogue_of(k2: KernelArgs, rb, tile_epilogue: bool):
    """A GEMM conv's epilogue for the tiles of one (image, group), whose result rows
    start at row rb (i64): callable per finished tile, with `apply` for its accumulators
    where the program runs in vectors; None where the epilogue runs after the kernel."""
    epi = row_epilogue(k2, 2, 2) if tile_epilogue else None
    if epi is None:
        return None

    return TileEpilogue(epi, rb)


class TileEpilogue:
    """A RowEpilogue seen from a GEMM whose row 0 is the epilogue's row rb (i64):
    callable per finished tile, `apply` on its accumulators (None where the epilogue
    does not run in vectors)."""

    def __init__(self, epi: RowEpilogue, rb):
        self.epi, self.rb = epi, rb
        self.apply = self._apply if epi.apply is not None else None

    def __call__(self, bb, r0, mr, c0, nc):
        self.epi(bb, bb.add(self.rb, r0), mr, c0, nc)

    def _apply(self, bb, r, col, vec):
        return self.epi.apply(bb, bb.add(self.rb, r), col, vec)
