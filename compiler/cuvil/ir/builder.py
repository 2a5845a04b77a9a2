"""Appending ops to a block by name: `b.op("cuvil.add", x, y)` returns the result value."""
from __future__ import annotations

import numpy as np

from .core import OP_REGISTRY, Block, Function, Op, Value
from .types import TensorType
from .ops.shape import Constant


class Builder:
    def __init__(self, block: Block, loc: str = ""):
        self.block = block
        self.loc = loc
        self.anchor: Op | None = None  # insert before this op; None appends

    def insert(self, op: Op) -> Op:
        if self.anchor is None:
            self.block.append(op)
        else:
            self.block.insert_before(self.anchor, op)
        return op

    def op(self, name: str, *operands: Value, **attrs) -> Value:
        return self.op_multi(name, *operands, **attrs)[0]

    def op_multi(self, name: str, *operands: Value, **attrs) -> list[Value]:
        op = OP_REGISTRY[name](list(operands), attrs, None, self.loc)
        return self.insert(op).results

    def constant(self, value, name: str, dtype=None) -> Value:
        arr = np.asarray(value, dtype=dtype)
        return self.insert(Constant(arr, name, self.loc)).result

    def control(self, name: str, operands, regions: list[Function], result_types: list[TensorType],
                **attrs) -> list[Value]:
        """A control-flow op (ir/ops/control.py) with its regions; verified at once."""
        op = OP_REGISTRY[name](list(operands), attrs, list(result_types), self.loc)
        op.regions = list(regions)
        op.verify()
        return self.insert(op).results
