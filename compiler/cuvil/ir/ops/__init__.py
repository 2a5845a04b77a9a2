"""Op definitions, one class per op, grouped by kind. Importing this registers them all."""
from . import custom, elementwise, nn, quant, reduce, shape  # noqa: F401  (registration side effect)
from .elementwise import (BINARY, COMPARE, ELEMENTWISE, UNARY, eval_program, infer_program,
                          program_inputs_used)
from .nn import ANCHORS

__all__ = ["ELEMENTWISE", "UNARY", "BINARY", "COMPARE", "ANCHORS", "eval_program",
           "infer_program", "program_inputs_used"]
