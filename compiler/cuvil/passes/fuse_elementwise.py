"""fuse-elementwise: turn every elementwise op into a `cuvil.fused` op (the backend
generates code only for those) and merge chains: a fused producer whose result has
exactly one user, itself elementwise or fused, becomes part of that user's program.

    %3 = mul(%x, %s)                         %5 = fused(%x, %s, %t) {program = [
    %4 = add(%3, %t)                 ->          ["mul", [0, 1], {}], ["add", [3, 2], {}],
    %5 = relu(%4)                                ["relu", [4], {}]]}

By default a producer is merged only if its result has its user's shape: a smaller one
(an SE gate [1, C, 1, 1] scaling [1, C, H, W]) would be recomputed for every output
element, so it stays a loop of its own unless `merge_broadcast` is set.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Module, Op, Value
from ..ir.ops import ELEMENTWISE
from .program import ProgramBuilder, short_name
from .rewrite import add_op, replace_op, single_user


@dataclass(frozen=True)
class FuseElementwise:
    name = "fuse-elementwise"
    merge_broadcast: bool = False

    def apply(self, module: Module) -> None:
        for fn in module.all_functions():
            for op in list(fn.body.ops):  # program order: producers are fused before users
                if op.name in ELEMENTWISE or op.name == "cuvil.fused":
                    self._fuse(op)

    def _mergeable(self, v: Value, user: Op) -> bool:
        p = v.defining_op
        return (p is not None and p.name == "cuvil.fused" and single_user(v) is user
                and (self.merge_broadcast or v.shape == user.result.shape))

    def _fuse(self, op: Op) -> None:
        merged = {id(v): v.defining_op for v in op.operands if self._mergeable(v, op)}
        if op.name == "cuvil.fused" and not merged:
            return
        b = ProgramBuilder()
        refs = {}
        for v in op.operands:
            if id(v) not in refs:
                p = merged.get(id(v))
                refs[id(v)] = b.inline(p.attrs["program"], [b.input(w) for w in p.operands]) if p else b.input(v)
        operand_refs = [refs[id(v)] for v in op.operands]
        if op.name == "cuvil.fused":
            out = b.inline(op.attrs["program"], operand_refs)
        else:
            out = b.emit(short_name(op.name), operand_refs, op.attrs)
        inputs, program = b.build(out)
        new = add_op(op.parent, op, "cuvil.fused", inputs, {"program": program}, op.loc)
        replace_op(op, [new.result])
        for p in merged.values():
            p.parent.erase(p)
