"""Helpers the rewriting passes share: reading constants, fresh constant names, building
ops in place of others, replacing and erasing ops."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..ir import OP_REGISTRY, Block, Module, Op, TensorType, Value
from ..ir.ops.shape import Constant


def const_value(v: Value) -> np.ndarray | None:
    """The array of a `cuvil.constant` result, else None."""
    op = v.defining_op
    return op.value if op is not None and op.name == "cuvil.constant" else None


def users(v: Value) -> list[Op]:
    """The distinct ops using `v`, in use order (an op using v twice appears once)."""
    seen: dict[int, Op] = {}
    for u in v.uses:
        seen.setdefault(id(u), u)
    return list(seen.values())


def single_user(v: Value) -> Op | None:
    us = users(v)
    return us[0] if len(us) == 1 else None


class ConstNames:
    """Fresh constant names, unique in one module and deterministic (they depend only on
    the names already taken and the order of requests)."""

    def __init__(self, module: Module):
        self.taken = {op.attrs["name"] for fn in module.all_functions()
                      for op in fn.body.ops if op.name == "cuvil.constant"}
        self.counters: dict[str, int] = {}

    def fresh(self, base: str) -> str:
        """`base` itself if free, else `base.1`, `base.2`, ..."""
        if base not in self.taken:
            self.taken.add(base)
            return base
        return self.numbered(base)

    def numbered(self, prefix: str) -> str:
        """`prefix.<n>` with the smallest n (from 1, counting on) that is free."""
        n = self.counters.get(prefix, 0)
        while True:
            n += 1
            name = f"{prefix}.{n}"
            if name not in self.taken:
                self.counters[prefix] = n
                self.taken.add(name)
                return name


def constant_name(v: Value) -> str:
    return v.defining_op.attrs["name"]


def add_constant(block: Block, before: Op, array: np.ndarray, name: str, loc: str = "") -> Value:
    """A new constant inserted before `before`, with exactly `array`'s shape."""
    array = np.asarray(array)
    op = Constant(array, name, loc)
    if op.value.shape != array.shape:  # Constant stores 0-d arrays as [1] (np.ascontiguousarray)
        op.value = op.value.reshape(array.shape)
        op.result.type = TensorType.of(op.value)
    return block.insert_before(before, op).result


def add_op(block: Block, before: Op, name: str, operands: Sequence[Value], attrs: dict[str, Any] | None = None,
           loc: str = "") -> Op:
    """A new op (result types inferred) inserted before `before`."""
    return block.insert_before(before, OP_REGISTRY[name](list(operands), attrs or {}, None, loc))


def replace_op(op: Op, new_values: Sequence[Value]) -> None:
    """Redirect every use of op's results to `new_values` and erase op."""
    for old, new in zip(op.results, new_values):
        if old is not new:
            old.replace_all_uses_with(new)
    op.parent.erase(op)


def erase_if_dead(op: Op | None) -> None:
    """Erase `op` (and then its operands' producers, recursively) if nothing uses it."""
    while op is not None and op.parent is not None and op.name != "cuvil.return" \
            and not any(r.uses for r in op.results):
        producers = [v.defining_op for v in op.operands]
        op.parent.erase(op)
        for p in producers[1:]:
            erase_if_dead(p)
        op = producers[0] if producers else None
