"""dce: erase ops none of whose results is used (every op is pure; `cuvil.return` stays),
constants included. A backward sweep removes whole dead chains (users come after their
operands, so an op's users are gone before it is looked at); sweeps repeat until one
removes nothing."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Module


@dataclass(frozen=True)
class DeadCodeElimination:
    name = "dce"

    def apply(self, module: Module) -> None:
        for fn in module.all_functions():
            removed = True
            while removed:
                removed = False
                for op in reversed(list(fn.body.ops)):
                    if op.name != "cuvil.return" and not any(r.uses for r in op.results):
                        fn.body.erase(op)
                        removed = True
