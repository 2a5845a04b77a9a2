"""Structured control flow: ops whose regions are nested functions.

- `cuvil.if(pred, *args)`: regions [then, else]; each takes `args` and returns the op's
  results. `pred` has one element (any dtype; non-zero is true).
- `cuvil.while(*init, *invariants) {carried = n}`: regions [cond, body]; both take the n
  loop-carried values then the invariants; `cond` returns one one-element predicate,
  `body` the next n carried values. The results are the carried values once `cond` is
  false (the initial ones if it is false at once).

A region is isolated from above: it reads only its own inputs (outer values come in as
operands), so every pass can treat it as a function of its own (Module.all_functions).
The memory plan gives a control op's results arena buffers of their own and its regions
an arena inside the op's scratch (passes/memory_plan.py); the backend emits each region as
a function called from a branch or a loop (backend/llvm/control.py).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...errors import VerifyError
from ..core import Function, Op, Value
from ..types import TensorType


def _same(types: Sequence[TensorType], others: Sequence[TensorType]) -> bool:
    return [(t.shape, t.dtype) for t in types] == [(t.shape, t.dtype) for t in others]


def _signature(fn: Function) -> str:
    return f"({', '.join(str(a.type) for a in fn.args)}) -> ({', '.join(str(v.type) for v in fn.outputs)})"


def _check_predicate(v: Value | TensorType, what: str) -> None:
    t = v.type if isinstance(v, Value) else v
    if t.is_static and t.numel != 1:
        raise VerifyError(f"{what} must have one element, not {t}")
    if not t.is_static:
        raise VerifyError(f"{what} must have a static shape, not {t}")


class ControlOp(Op):
    """An op with regions; its result types are given, not inferred (they are its
    regions' output types, checked by verify)."""
    region_names: tuple[str, ...] = ()

    @classmethod
    def infer_types(cls, types, attrs):
        raise VerifyError(f"{cls.name}: result types come from its regions")

    @classmethod
    def reference(cls, args, attrs):
        raise VerifyError(f"{cls.name}: run it with the interpreter (its regions are not in its attributes)")

    def check_regions(self, inputs: Sequence[TensorType]) -> None:
        if len(self.regions) != len(self.region_names):
            raise VerifyError(f"{self.name} has {len(self.regions)} regions, expected {len(self.region_names)} "
                              f"({', '.join(self.region_names)})")
        for what, fn in zip(self.region_names, self.regions):
            if not _same([a.type for a in fn.args], inputs):
                raise VerifyError(f"{self.name}: its {what} region takes {_signature(fn)}, the op passes "
                                  f"({', '.join(map(str, inputs))})")

    def run(self, args: list[np.ndarray], dims: dict) -> list[np.ndarray]:
        raise NotImplementedError(self.name)


class If(ControlOp):
    name = "cuvil.if"
    region_names = ("then", "else")

    def verify(self) -> None:
        if not self.operands:
            raise VerifyError("cuvil.if needs a predicate operand")
        _check_predicate(self.operands[0], "cuvil.if's predicate")
        self.check_regions([v.type for v in self.operands[1:]])
        results = [r.type for r in self.results]
        for what, fn in zip(self.region_names, self.regions):
            if not _same([v.type for v in fn.outputs], results):
                raise VerifyError(f"cuvil.if: its {what} region returns {_signature(fn)}, the op's results are "
                                  f"({', '.join(map(str, results))})")

    def run(self, args, dims):
        from ..interpreter import run_function
        branch = self.regions[0] if np.asarray(args[0]).reshape(-1)[0] else self.regions[1]
        return list(run_function(branch, args[1:], dims))


class While(ControlOp):
    name = "cuvil.while"
    region_names = ("cond", "body")

    @property
    def carried(self) -> int:
        return int(self.attrs.get("carried", len(self.operands)))

    def verify(self) -> None:
        n = self.carried
        if not 0 < n <= len(self.operands):
            raise VerifyError(f"cuvil.while: carried = {n}, but it has {len(self.operands)} operands")
        carried = [v.type for v in self.operands[:n]]
        if not _same([r.type for r in self.results], carried):
            raise VerifyError("cuvil.while: its results must have the carried values' types "
                              f"({', '.join(map(str, carried))})")
        self.check_regions([v.type for v in self.operands])
        cond, body = self.regions
        if len(cond.outputs) != 1:
            raise VerifyError(f"cuvil.while: its cond region returns {len(cond.outputs)} values, not one predicate")
        _check_predicate(cond.outputs[0], "cuvil.while's condition")
        if not _same([v.type for v in body.outputs], carried):
            raise VerifyError(f"cuvil.while: its body region returns {_signature(body)}, the carried values are "
                              f"({', '.join(map(str, carried))})")

    def run(self, args, dims):
        from ..interpreter import run_function
        n = self.carried
        state, invariants = list(args[:n]), list(args[n:])
        cond, body = self.regions
        while np.asarray(run_function(cond, state + invariants, dims)[0]).reshape(-1)[0]:
            state = list(run_function(body, state + invariants, dims))
        return [np.array(s, copy=True) for s in state]


CONTROL = frozenset({If.name, While.name})


def scratch_layout(op: Op, nbytes, align) -> tuple[int, list[int], int]:
    """How a control op's scratch is laid out: (bytes of its regions' arena, which comes
    first, the offsets of the while loop's predicate and next carried values after it,
    the total). `nbytes(value)` sizes a value (at its bounds), `align(n)` rounds up."""
    arena = align(max((int(fn.attrs.get("arena_size", 0)) for fn in op.regions), default=0))
    if op.name != While.name:
        return arena, [], arena
    cond, body = op.regions
    offsets, at = [], arena
    for v in [cond.outputs[0], *body.outputs]:
        offsets.append(at)
        at += align(nbytes(v))
    return arena, offsets, at
