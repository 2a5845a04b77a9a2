"""Module verifier: SSA dominance, use lists, op rules, terminator."""
from __future__ import annotations

from ..errors import VerifyError
from .core import Module


def verify(module: Module) -> None:
    if "main" not in module.functions:
        raise VerifyError("module has no main function")
    for fn in module.all_functions():
        defined = {id(a) for a in fn.args}
        if len(fn.input_names) != len(fn.args):
            raise VerifyError(f"function {fn.name}: {len(fn.args)} inputs but {len(fn.input_names)} names")
        for i, op in enumerate(fn.body.ops):
            where = f"function {fn.name}, op {i} ({op.name}{', ' + op.loc if op.loc else ''})"
            for v in op.operands:
                if id(v) not in defined:
                    raise VerifyError(f"{where}: operand used before it is defined")
                if op not in v.uses:
                    raise VerifyError(f"{where}: use list out of date")
            try:
                op.verify()
            except VerifyError as e:
                raise VerifyError(f"{where}: {e}") from None
            if op.name == "cuvil.return" and i != len(fn.body.ops) - 1:
                raise VerifyError(f"{where}: cuvil.return must be last")
            defined.update(id(r) for r in op.results)
        ret = fn.return_op
        if len(ret.operands) != len(fn.output_names):
            raise VerifyError(f"function {fn.name}: returns {len(ret.operands)} values "
                              f"but names {len(fn.output_names)} outputs")
