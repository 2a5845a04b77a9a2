"""Kernels of ops with a data-dependent size (ir/ops/dynamic.py): each stores the size
it found into the run's `dims` (the produced symbol's slot), which every later kernel
reads when it starts."""
from __future__ import annotations

from math import prod

from llvmlite import ir

from ..emit import I64, i64, load, store
from ..kernel_args import KernelArgs
from ..loops import alloca_in_entry, for_range


def store_size(b, k: KernelArgs, value: ir.Value) -> None:
    """Set the op's produced dim to `value` for the rest of the run."""
    slot = b.gep(k.dims, [i64(k.symbols[k.attrs["size"]])], inbounds=True)
    b.store(value, slot)


def k_nonzero(b, k: KernelArgs):
    """One pass in row-major order: each true element appends its coordinates."""
    xt = k.in_types[0]
    shape = [int(d) for d in xt.shape]
    rank = len(shape)
    count = alloca_in_entry(b, I64)
    b.store(i64(0), count)
    with for_range(b, prod(shape) if rank else 1, name="e") as e:
        with b.if_then(load(b, k.ins[0], e, "bool")):
            c = b.load(count)
            rem = e
            for d in reversed(range(rank)):
                store(b, b.urem(rem, i64(shape[d])) if d else rem, k.out,
                      b.add(b.mul(c, i64(rank)), i64(d)), "i64")
                rem = b.udiv(rem, i64(shape[d]))
            b.store(b.add(c, i64(1)), count)
    store_size(b, k, b.load(count))
