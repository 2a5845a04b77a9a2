"""Elementwise loops: a cuvil.fused program over broadcast operands, in parallel chunks
of the outer dims.
"""
from __future__ import annotations

from math import prod

from llvmlite import ir

from ....errors import BackendError
from ....ir.types import TensorType
from ..emit import (REG_TYPES, View, broadcast_strides, contiguous_strides, emit_program, fconst, load,
                    loop_nest, store)
from ..kernel_args import KernelArgs
from ..parallel import flat_offsets, outer_split, parallel
from ..symbolic import KType


def emit_elementwise(b: ir.IRBuilder, out: ir.Value, out_type: TensorType, ins, in_types, consts,
                     program, first_is_out: bool = False) -> None:
    """out[i] = program(inputs broadcast to out). With first_is_out, slot 0 is out itself
    (a conv/matmul epilogue applied in place)."""
    shape = list(out_type.shape)
    views = [View(out, out_type.dtype, contiguous_strides(shape))]
    slots = []  # per program input: ('view', k) or ('const', value)
    for i, (p, t) in enumerate(zip(ins, in_types)):
        if i in consts:
            slots.append(("const", fconst(t.dtype, consts[i]) if t.dtype in ("f32", "f16", "f64")
                          else ir.Constant(REG_TYPES[t.dtype], int(consts[i]))))
        else:
            views.append(View(p, t.dtype, broadcast_strides(t.shape, shape)))
            slots.append(("view", len(views) - 1))
    dtypes = [t.dtype for t in in_types]

    def body(b, idx):
        vals = []
        for kind, v in slots:
            vals.append(v if kind == "const" else load(b, views[v].ptr, idx[v], views[v].dtype))
        prog_vals = ([load(b, out, idx[0], out_type.dtype)] + vals) if first_is_out else vals
        prog_types = ([out_type.dtype] + dtypes) if first_is_out else dtypes
        res, rdt = emit_program(b, program, prog_vals, prog_types)
        if rdt != out_type.dtype:
            raise BackendError(f"program yields {rdt}, result is {out_type.dtype}")
        store(b, res, out, idx[0], out_type.dtype)

    loop_nest(b, shape, views, body)


def k_fused(b, k: KernelArgs):
    shape = list(k.out_type.shape)
    split = outer_split(shape)
    if not split:
        emit_elementwise(b, k.out, k.out_type, k.ins, k.in_types, k.consts, k.attrs["program"])
        return
    outer, inner = shape[:split], shape[split:]
    full = [[1] * (len(shape) - t.rank) + list(t.shape) for t in k.in_types]
    strides = [contiguous_strides(shape)] + [broadcast_strides(t.shape, shape) for t in k.in_types]
    sub_types = [KType(tuple(f[split:]), t.dtype) for f, t in zip(full, k.in_types)]

    def body(b, k2, i, _):
        offs = flat_offsets(b, i, outer, strides)
        out = b.gep(k2.out, [offs[0]], inbounds=True)
        ins = [None if p is None else b.gep(p, [o], inbounds=True) for p, o in zip(k2.ins, offs[1:])]
        emit_elementwise(b, out, KType(tuple(inner), k.out_type.dtype), ins, sub_types, k.consts,
                         k.attrs["program"])
    parallel(b, k, prod(outer), body)
