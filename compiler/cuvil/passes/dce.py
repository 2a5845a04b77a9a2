"""dce: erase ops none of whose results is used (every op is pure; `cuvil.return` stays),
constants included, unless another op reads a size the op produces (ir/ops/dynamic.py). A backward sweep removes whole dead chains (users come after their
operands, so an op's users are gone before it is looked at); sweeps repeat until one
removes nothing."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Module
from ..ir import symdim
from ..ir.ops.dynamic import produced_symbols


@dataclass(frozen=True)
class DeadCodeElimination:
    name = "dce"

    def apply(self, module: Module) -> None:
        for fn in module.all_functions():
            removed = True
            while removed:
                removed = False
                for op in reversed(list(fn.body.ops)):
                    if op.name != "cuvil.return" and not any(r.uses for r in op.results) \
                            and not _size_used(module, op):
                        fn.body.erase(op)
                        removed = True


def _size_used(module: Module, producer) -> bool:
    """Whether another op still reads a size `producer` produces (x.shape[0] of a nonzero
    result, as a cuvil.dim or in a type): the op then stays, for its size."""
    wanted = set(produced_symbols(producer))
    if not wanted:
        return False
    for fn in module.all_functions():
        for op in fn.body.ops:
            if op is producer:
                continue
            dims = [d for v in [*op.operands, *op.results] for d in v.type.shape]
            dims += [d for key in type(op).dim_attrs for d in op.attrs.get(key) or []]
            if any(isinstance(d, str) and symdim.symbols(d) & wanted for d in dims):
                return True
    return False
