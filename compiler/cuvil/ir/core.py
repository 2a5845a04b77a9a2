"""SSA core: Value, Op, Block, Function, Module.

An `Op` subclass is the one definition of an op: its name, operand count, verifier,
type rule and NumPy reference. `OP_REGISTRY` maps names to those classes so the parser
and passes can build ops by name.
"""
from __future__ import annotations

from typing import Any, ClassVar, Iterable, Sequence

import numpy as np

from ..errors import VerifyError
from .types import TensorType

OP_REGISTRY: dict[str, type["Op"]] = {}


class Value:
    """An SSA value: the result of exactly one op, or an argument of a block."""

    __slots__ = ("type", "owner", "index", "uses")

    def __init__(self, type: TensorType, owner: "Op | Block", index: int):
        self.type = type
        self.owner = owner
        self.index = index
        self.uses: list[Op] = []

    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def defining_op(self) -> "Op | None":
        return self.owner if isinstance(self.owner, Op) else None

    def replace_all_uses_with(self, new: "Value") -> None:
        for user in list(self.uses):
            user.operands = [new if v is self else v for v in user.operands]
            new.uses.append(user)
        self.uses.clear()

    def __repr__(self) -> str:
        return f"<Value {self.type}>"


class Op:
    """Base class of all ops. Subclasses set `name` and may set `num_operands`."""

    name: ClassVar[str] = ""
    num_operands: ClassVar[int | None] = None  # None: variadic, checked by verify()
    # Attributes that hold dims (lists of int | symbolic dim text); the interpreter and the
    # backend evaluate symbolic ones with the symbols' runtime values.
    dim_attrs: ClassVar[tuple[str, ...]] = ()
    # Optional source location (e.g. "model.py:42 in forward") for error messages.
    __slots__ = ("operands", "attrs", "results", "parent", "loc", "regions")

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            if cls.name in OP_REGISTRY:
                raise RuntimeError(f"op {cls.name} defined twice")
            OP_REGISTRY[cls.name] = cls

    def __init__(self, operands: Sequence[Value], attrs: dict[str, Any] | None = None,
                 result_types: Sequence[TensorType] | None = None, loc: str = ""):
        self.operands = list(operands)
        self.attrs = dict(attrs or {})
        self.parent: Block | None = None
        self.loc = loc
        # Nested functions (ir/ops/control.py: the branches of cuvil.if, the condition and
        # body of cuvil.while). A region sees only its own inputs: every outer value it
        # reads is an operand of the op (regions are isolated from above).
        self.regions: list[Function] = []
        for v in self.operands:
            v.uses.append(self)
        if result_types is None:
            self.check_operand_count()
            result_types = self.infer_types([v.type for v in self.operands], self.attrs)
        self.results = [Value(t, self, i) for i, t in enumerate(result_types)]

    # -- the definition a subclass provides -------------------------------------------
    @classmethod
    def infer_types(cls, types: list[TensorType], attrs: dict) -> list[TensorType]:
        raise NotImplementedError(cls.name)

    @classmethod
    def reference(cls, args: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
        raise NotImplementedError(cls.name)

    def verify(self) -> None:
        """Check operand count and that result types agree with the type rule."""
        self.check_operand_count()
        try:
            expected = self.infer_types([v.type for v in self.operands], self.attrs)
        except VerifyError:
            raise
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise VerifyError(f"{self.name}: {e}") from None
        got = [v.type for v in self.results]
        if [(t.shape, t.dtype) for t in expected] != [(t.shape, t.dtype) for t in got]:
            raise VerifyError(f"{self.name}: result types {', '.join(map(str, got))} "
                              f"do not match inferred {', '.join(map(str, expected))}")

    # -- helpers ------------------------------------------------------------------------
    def check_operand_count(self) -> None:
        n = self.num_operands
        if n is not None and len(self.operands) != n:
            raise VerifyError(f"{self.name} takes {n} operands, got {len(self.operands)}")

    @property
    def result(self) -> Value:
        return self.results[0]

    def set_operand(self, i: int, new: Value) -> None:
        old = self.operands[i]
        old.uses.remove(self)
        self.operands[i] = new
        new.uses.append(self)

    def drop_operands(self) -> None:
        for v in self.operands:
            if self in v.uses:
                v.uses.remove(self)
        self.operands = []

    def __repr__(self) -> str:
        return f"<{self.name} {self.attrs}>"


class Block:
    """A list of ops with block arguments (the function's inputs)."""

    def __init__(self, arg_types: Iterable[TensorType] = ()):
        self.args = [Value(t, self, i) for i, t in enumerate(arg_types)]
        self.ops: list[Op] = []

    def append(self, op: Op) -> Op:
        op.parent = self
        self.ops.append(op)
        return op

    def insert_before(self, anchor: Op, op: Op) -> Op:
        op.parent = self
        self.ops.insert(self.ops.index(anchor), op)
        return op

    def erase(self, op: Op) -> None:
        if any(r.uses for r in op.results):
            raise VerifyError(f"cannot erase {op.name}: its result is still used")
        op.drop_operands()
        self.ops.remove(op)
        op.parent = None


class Function:
    """A function: named inputs (block args), a body, and a `cuvil.return` terminator."""

    def __init__(self, name: str, input_names: Sequence[str], input_types: Sequence[TensorType],
                 output_names: Sequence[str] = ()):
        self.name = name
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.body = Block(input_types)
        self.attrs: dict = {}  # e.g. arena_size, set by memory planning

    @property
    def args(self) -> list[Value]:
        return self.body.args

    @property
    def return_op(self) -> Op:
        op = self.body.ops[-1] if self.body.ops else None
        if op is None or op.name != "cuvil.return":
            raise VerifyError(f"function {self.name} has no cuvil.return terminator")
        return op

    @property
    def outputs(self) -> list[Value]:
        return list(self.return_op.operands)


class Module:
    """A set of functions; `main` is the model's entry point."""

    def __init__(self):
        self.functions: dict[str, Function] = {}

    def add(self, fn: Function) -> Function:
        self.functions[fn.name] = fn
        return fn

    @property
    def main(self) -> Function:
        return self.functions["main"]

    def weights(self) -> dict[str, np.ndarray]:
        """All constants' arrays by name, in program order (regions included)."""
        out: dict[str, np.ndarray] = {}
        for fn in self.all_functions():
            for op in fn.body.ops:
                if op.name == "cuvil.constant":
                    out[op.attrs["name"]] = op.value
        return out

    def all_functions(self) -> list[Function]:
        """Every function, the regions of control-flow ops included: each region before
        the function that holds it (inner first), top-level functions in their order."""
        out: list[Function] = []
        for fn in self.functions.values():
            out += nested_functions(fn)
            out.append(fn)
        return out


def nested_functions(fn: Function) -> list[Function]:
    """The regions of fn's ops, recursively, inner ones before the ones holding them."""
    out: list[Function] = []
    for op in fn.body.ops:
        for region in op.regions:
            out += nested_functions(region)
            out.append(region)
    return out
