"""constant-fold: evaluate every op whose operands are all constants with the interpreter
and replace it by a new constant named `fold.<n>` (n counts up over the module, skipping
names already taken). An op is left alone when its result would be much larger than its
inputs (e.g. a scalar broadcast to a feature map: cheaper to compute than to store) or
when its reference rejects the values (the error then surfaces at run time). A
`cuvil.dequantize` is never folded: it is how a weight stays narrow in the artifact."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CuvilError
from ..ir import Module
from ..ir.interpreter import evaluate_op
from .rewrite import ConstNames, add_constant, const_value, replace_op


@dataclass(frozen=True)
class ConstantFold:
    name = "constant-fold"
    # Skip a fold whose results exceed both max_growth x the inputs' bytes and max_bytes.
    max_growth: float = 4.0
    max_bytes: int = 1 << 20

    def apply(self, module: Module) -> None:
        names = ConstNames(module)
        for fn in module.all_functions():
            for op in list(fn.body.ops):
                if op.name in ("cuvil.constant", "cuvil.return", "cuvil.dequantize") or not op.operands or op.regions:
                    continue
                args = [const_value(v) for v in op.operands]
                if any(a is None for a in args) or not self._small_enough(op, args):
                    continue
                try:
                    with np.errstate(all="ignore"):
                        outs = evaluate_op(op, args)
                except (CuvilError, ArithmeticError, ValueError, IndexError):
                    continue
                news = [add_constant(op.parent, op, o, names.numbered("fold"), op.loc) for o in outs]
                replace_op(op, news)

    def _small_enough(self, op, args) -> bool:
        if not all(r.type.is_static for r in op.results):
            return False
        out = sum(r.type.nbytes for r in op.results)
        return out <= self.max_bytes or out <= self.max_growth * sum(a.nbytes for a in args)
