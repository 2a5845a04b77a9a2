"""Builder helpers for control flow: counted loops and entry-block allocas.

`for_range` emits the loop shape LLVM's loop passes expect, so the vectoriser
sees it after `optimize`:

    preheader:  br header
    header:     %i = phi i64 [start, preheader], [%i.next, latch]
                br (%i < stop), body, exit
    body:       ... (what the `with` block emits) ... br latch
    latch:      %i.next = add nsw %i, step ; br header
    exit:       (the builder is left here)

For a conditional, llvmlite's own `builder.if_then(pred)` / `builder.if_else(pred)`
context managers already emit the right blocks; use them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from llvmlite import ir

from .symbolic import Size

I64 = ir.IntType(64)


def _as_i64(builder: ir.IRBuilder, value: ir.Value | int, name: str) -> ir.Value:
    if isinstance(value, int):
        return ir.Constant(I64, value)
    if isinstance(value, Size):  # a symbolic dim's runtime value
        return value.value()
    if value.type != I64:
        if not isinstance(value.type, ir.IntType):
            raise TypeError(f"loop bound {name} must be an integer, got {value.type}")
        return builder.sext(value, I64, name=name)
    return value


@contextlib.contextmanager
def for_range(
    builder: ir.IRBuilder,
    count: ir.Value | int,
    start: ir.Value | int = 0,
    step: ir.Value | int = 1,
    name: str = "i",
) -> Iterator[ir.Value]:
    """Loop `i` over range(start, count, step) (i64) and yield `i`.

    `count` is the exclusive upper bound, as in numba's `cgutils.for_range`;
    with the default start and step it is the trip count. Bounds may be
    Python ints or integer `ir.Value`s (sign-extended to i64). A Python-int
    `step` may be negative (the loop then runs while i > count); an `ir.Value`
    step must be positive.

    The body may add blocks of its own; the loop continues from whichever
    block the builder ends in (unless the body terminated it).
    """
    if isinstance(step, int) and step == 0:
        raise ValueError("for_range step must not be 0")
    stop = _as_i64(builder, count, f"{name}.stop")
    first = _as_i64(builder, start, f"{name}.start")
    stride = _as_i64(builder, step, f"{name}.step")
    descending = isinstance(step, int) and step < 0

    preheader = builder.block
    header = builder.append_basic_block(f"{name}.header")
    body = builder.append_basic_block(f"{name}.body")
    latch = builder.append_basic_block(f"{name}.latch")
    exit_block = builder.append_basic_block(f"{name}.exit")

    builder.branch(header)
    builder.position_at_end(header)
    index = builder.phi(I64, name=name)
    index.add_incoming(first, preheader)
    in_range = builder.icmp_signed(">" if descending else "<", index, stop, name=f"{name}.cond")
    builder.cbranch(in_range, body, exit_block)

    builder.position_at_end(body)
    yield index
    if not builder.block.is_terminated:
        builder.branch(latch)

    builder.position_at_end(latch)
    following = builder.add(index, stride, name=f"{name}.next", flags=["nsw"])
    index.add_incoming(following, latch)
    builder.branch(header)

    builder.position_at_end(exit_block)


def alloca_in_entry(builder: ir.IRBuilder, ty: ir.Type, name: str = "") -> ir.AllocaInstr:
    """An alloca at the top of the function's entry block (so mem2reg/SROA see it)."""
    entry = builder.function.entry_basic_block
    with builder.goto_block(entry):
        if entry.instructions:
            builder.position_before(entry.instructions[0])
        return builder.alloca(ty, name=name)
