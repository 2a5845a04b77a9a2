"""Runs any module with the ops' NumPy references: the oracle for tests and the engine
of constant folding."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import CuvilError
from . import symdim
from .core import Function, Module, Op
from .ops.dynamic import produced_symbols


# Attributes the memory planner adds; they do not change what an op computes.
PLAN_ATTRS = frozenset({"arena_offset", "arena_offsets", "alias", "scratch_offset", "scratch_bytes", "kernel_plan",
                        "loop_offsets"})


def evaluate_op(op: Op, args: list[np.ndarray], dims: dict[str, int] | None = None) -> list[np.ndarray]:
    """Run one op's reference; `dims` binds the symbolic dims of its types and attributes."""
    if op.name == "cuvil.constant":
        return [op.value]
    attrs = {k: v for k, v in op.attrs.items() if k not in PLAN_ATTRS}
    for key in type(op).dim_attrs:
        if key in attrs and any(isinstance(d, str) for d in attrs[key]):
            attrs[key] = symdim.substitute(attrs[key], dims or {})
    outs = type(op).reference(args, attrs)
    for size in produced_symbols(op):  # a data-dependent size: bound by what the op found
        if dims is not None:
            dims[size] = int(np.shape(outs[0])[0])
    return [np.asarray(o, dtype=r.type.np_dtype).reshape(symdim.substitute(r.type.shape, dims or {}))
            for o, r in zip(outs, op.results)]


def bind_dims(fn: Function, inputs: Sequence[np.ndarray]) -> dict[str, int]:
    """Symbol values from the inputs' shapes (a symbol must be a whole dim of an input);
    checks static dims, agreement between inputs and the function's bounds."""
    env: dict[str, int] = {}
    bounds = fn.attrs.get("dim_bounds") or {}
    for a, x, name in zip(fn.args, inputs, fn.input_names):
        shape = np.shape(x)
        if len(shape) != a.type.rank:
            raise CuvilError(f"input {name!r}: expected shape {list(a.type.shape)}, got {list(shape)}")
        for i, (d, n) in enumerate(zip(a.type.shape, shape)):
            if isinstance(d, int):
                if d != n:
                    raise CuvilError(f"input {name!r}: expected shape {list(a.type.shape)}, got {list(shape)}")
                continue
            if d in env and env[d] != n:
                raise CuvilError(f"input {name!r}: dim {i} ({d}) is {n}, but another input gives {d} = {env[d]}")
            lo, hi = bounds.get(d, (1, None))
            if n < lo or (hi is not None and n > hi):
                raise CuvilError(f"input {name!r}: dim {i} ({d}) = {n} is outside its bounds [{lo}, {hi}]")
            env[d] = int(n)
    return env


def run_function(fn: Function, inputs: Sequence[np.ndarray],
                 dims: dict[str, int] | None = None) -> tuple[np.ndarray, ...]:
    """Run fn on inputs; `dims` (a region's caller's symbol values) or else fn's inputs
    bind its symbolic dims."""
    if len(inputs) != len(fn.args):
        raise CuvilError(f"{fn.name} takes {len(fn.args)} inputs, got {len(inputs)}")
    env: dict[int, np.ndarray] = {}
    dims = bind_dims(fn, inputs) if dims is None else dims
    for a, x, name in zip(fn.args, inputs, fn.input_names):
        env[id(a)] = np.asarray(x).astype(a.type.np_dtype, copy=False)
    for op in fn.body.ops:
        if op.name == "cuvil.return":
            return tuple(env[id(v)] for v in op.operands)
        args = [env[id(v)] for v in op.operands]
        outs = op.run(args, dims) if op.regions else evaluate_op(op, args, dims)
        for r, o in zip(op.results, outs):
            env[id(r)] = o
    raise CuvilError(f"function {fn.name} has no return")


def run(module: Module, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    return run_function(module.main, inputs)
