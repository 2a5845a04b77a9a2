"""Op definitions, one class per op, grouped by kind. Importing this registers them all."""
from . import control, custom, dynamic, elementwise, nn, quant, reduce, shape  # noqa: F401  (registration side effect)
from .elementwise import (BINARY, COMPARE, ELEMENTWISE, UNARY, eval_program, infer_program,
                          program_inputs_used)
from .control import CONTROL
from .nn import ANCHORS

__all__ = ["CONTROL", "ELEMENTWISE", "UNARY", "BINARY", "COMPARE", "ANCHORS", "eval_program",
           "infer_program", "program_inputs_used"]
