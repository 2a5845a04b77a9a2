"""fuse-epilogues: absorb the elementwise ops that follow a conv2d / matmul into its `post`
program (ir/ops/nn.py: slot 0 is the raw result, slots 1.. the extra operands).

While the anchor's result has exactly one user, that user is an elementwise op and its
result has the anchor's shape and dtype, the user's other operands become extras and its
op joins the program:

    %2 = conv2d(%x, %w)                      %4 = conv2d(%x, %w, %b, %res) {post = [
    %3 = add(%2, %b)                 ->          ["add", [0, 1], {}], ["add", [3, 2], {}],
    %4 = add(%3, %res)                           ["relu", [4], {}]]}
    %5 = relu(%4)

The new anchor is built where the absorbed op was, because an extra (a residual) may be
defined after the old anchor; the anchor's own operands dominate that point.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Module, Op
from ..ir.ops import ANCHORS, ELEMENTWISE
from .program import ProgramBuilder, short_name
from .rewrite import add_op, replace_op, single_user

_RAW = object()  # key of the raw result's slot


def absorb(anchor: Op) -> Op | None:
    """Fuse the anchor's single elementwise user into it; the new anchor, or None."""
    r = anchor.result
    user = single_user(r)
    if user is None or user.name not in ELEMENTWISE:
        return None
    if (user.result.shape, user.result.dtype) != (r.shape, r.dtype):
        return None
    b = ProgramBuilder()
    raw = b.input(_RAW)
    extras = [b.input(v) for v in anchor.operands[2:]]
    post = anchor.attrs.get("post") or []
    cur = b.inline(post, [raw, *extras]) if post else raw
    out = b.emit(short_name(user.name), [cur if v is r else b.input(v) for v in user.operands], user.attrs)
    inputs, program = b.build(out, keep_first=True)
    new = add_op(user.parent, user, anchor.name, [*anchor.operands[:2], *inputs[1:]],
                 {**anchor.attrs, "post": program}, anchor.loc)
    replace_op(user, [new.result])
    anchor.parent.erase(anchor)
    return new


@dataclass(frozen=True)
class FuseEpilogues:
    name = "fuse-epilogues"

    def apply(self, module: Module) -> None:
        for fn in module.all_functions():
            for anchor in [op for op in fn.body.ops if op.name in ANCHORS]:
                while anchor is not None:
                    anchor = absorb(anchor)
