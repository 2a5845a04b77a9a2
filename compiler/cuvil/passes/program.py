"""Building elementwise programs (the `program` of `cuvil.fused`, the `post` of conv2d /
matmul; format in ir/ops/elementwise.py) for the fusion passes.

Inputs are keyed by identity and deduplicated; identical instructions on identical
operands are emitted once; `build` drops what the output does not need and numbers the
slots, so programs come out compact and in a deterministic order.
"""
from __future__ import annotations

from typing import Hashable

from ..ir.printer import format_attrs

Ref = tuple[str, int]  # ("in", input index) or ("op", instruction index)


class ProgramBuilder:
    def __init__(self):
        self.inputs: list = []
        self._input_refs: dict[int, Ref] = {}
        self.instrs: list[tuple[str, list[Ref], dict]] = []
        self._shared: dict[Hashable, Ref] = {}

    def input(self, value) -> Ref:
        """The slot of `value` (any object, compared by identity), added on first use."""
        if id(value) not in self._input_refs:
            self._input_refs[id(value)] = ("in", len(self.inputs))
            self.inputs.append(value)
        return self._input_refs[id(value)]

    def emit(self, op: str, refs: list[Ref], attrs: dict) -> Ref:
        """Instruction `op` (short name, e.g. "add") on `refs`."""
        key = (op, tuple(refs), format_attrs(attrs))
        if key not in self._shared:
            self.instrs.append((op, list(refs), dict(attrs)))
            self._shared[key] = ("op", len(self.instrs) - 1)
        return self._shared[key]

    def inline(self, program: list, refs: list[Ref]) -> Ref:
        """Append `program` with its input slots bound to `refs`; returns its output."""
        slots = list(refs)
        for op, srcs, attrs in program:
            slots.append(self.emit(op, [slots[s] for s in srcs], attrs))
        return slots[-1]

    def build(self, out: Ref, keep_first: bool = False) -> tuple[list, list]:
        """(inputs the program reads, the program computing `out`). With keep_first the
        first input stays slot 0 even if unread (an epilogue's raw result)."""
        assert out[0] == "op", "a program needs at least one instruction"
        live, stack = set(), [out]
        while stack:
            ref = stack.pop()
            if ref not in live:
                live.add(ref)
                if ref[0] == "op":
                    stack.extend(self.instrs[ref[1]][1])
        kept_in = [i for i in range(len(self.inputs)) if ("in", i) in live or (keep_first and i == 0)]
        kept_ops = [k for k in range(len(self.instrs)) if ("op", k) in live]
        slot = {("in", i): n for n, i in enumerate(kept_in)}
        slot.update({("op", k): len(kept_in) + n for n, k in enumerate(kept_ops)})
        program = [[self.instrs[k][0], [slot[r] for r in self.instrs[k][1]], self.instrs[k][2]] for k in kept_ops]
        return [self.inputs[i] for i in kept_in], program


def short_name(op_name: str) -> str:
    """"cuvil.add" -> "add" (program instructions name ops without the dialect)."""
    return op_name.split(".", 1)[1]
