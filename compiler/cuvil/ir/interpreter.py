"""Runs any module with the ops' NumPy references: the oracle for tests and the engine
of constant folding."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import CuvilError
from .core import Function, Module, Op


# Attributes the memory planner adds; they do not change what an op computes.
PLAN_ATTRS = frozenset({"arena_offset", "alias", "scratch_offset", "scratch_bytes"})


def evaluate_op(op: Op, args: list[np.ndarray]) -> list[np.ndarray]:
    if op.name == "cuvil.constant":
        return [op.value]
    attrs = {k: v for k, v in op.attrs.items() if k not in PLAN_ATTRS}
    outs = type(op).reference(args, attrs)
    return [np.asarray(o, dtype=r.type.np_dtype).reshape(r.type.shape) for o, r in zip(outs, op.results)]


def run_function(fn: Function, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    if len(inputs) != len(fn.args):
        raise CuvilError(f"{fn.name} takes {len(fn.args)} inputs, got {len(inputs)}")
    env: dict[int, np.ndarray] = {}
    for a, x, name in zip(fn.args, inputs, fn.input_names):
        x = np.asarray(x)
        if tuple(x.shape) != a.type.shape and a.type.is_static:
            raise CuvilError(f"input {name!r}: expected shape {list(a.type.shape)}, got {list(x.shape)}")
        env[id(a)] = x.astype(a.type.np_dtype, copy=False)
    for op in fn.body.ops:
        if op.name == "cuvil.return":
            return tuple(env[id(v)] for v in op.operands)
        outs = evaluate_op(op, [env[id(v)] for v in op.operands])
        for r, o in zip(op.results, outs):
            env[id(r)] = o
    raise CuvilError(f"function {fn.name} has no return")


def run(module: Module, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    return run_function(module.main, inputs)
