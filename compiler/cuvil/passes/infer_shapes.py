"""infer-shapes: re-derive every op's result types from its operands with the op's own
type rule, in program order, so a change upstream (e.g. an input given a symbolic
`batch` dim) reaches every value. An op whose rule rejects its operands is an error
naming the op and its source location."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import VerifyError
from ..ir import Module, TensorType


@dataclass(frozen=True)
class InferShapes:
    name = "infer-shapes"

    def apply(self, module: Module) -> None:
        for fn in module.all_functions():
            for i, op in enumerate(fn.body.ops):
                if op.name in ("cuvil.constant", "cuvil.return") or op.regions:
                    continue  # a control-flow op's types are its regions' (its verify checks them)
                where = f"function {fn.name}, op {i} ({op.name}{', ' + op.loc if op.loc else ''})"
                op.check_operand_count()
                try:
                    types = op.infer_types([v.type for v in op.operands], op.attrs)
                except VerifyError as e:
                    raise VerifyError(f"{where}: {e}") from None
                except (ValueError, KeyError, TypeError, IndexError) as e:
                    raise VerifyError(f"{where}: {type(e).__name__}: {e}") from None
                if len(types) != len(op.results):
                    raise VerifyError(f"{where}: rule gives {len(types)} results, op has {len(op.results)}")
                for r, t in zip(op.results, types):
                    if (r.type.shape, r.type.dtype) != (t.shape, t.dtype):
                        # Keep a layout the value already had; the rules do not track layouts.
                        r.type = TensorType(t.shape, t.dtype, t.layout or r.type.layout)
