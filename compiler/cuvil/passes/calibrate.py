"""Calibration for int8: per-tensor ranges of chosen values over calibration inputs,
found by running the module with the NumPy interpreter (the reference engine).

`ranges="minmax"`: the smallest and largest value seen over all inputs.
`ranges="percentile"`: per input, the (100 - p)th and pth percentiles of the value;
then their mean over the inputs (outliers of one input do not set the range).
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from ..errors import CuvilError
from ..ir import Function, Op, Value
from ..ir.interpreter import bind_dims, evaluate_op

RANGES = ("minmax", "percentile")


def _walk(fn: Function, inputs: Sequence[np.ndarray], visit: Callable[[Op, list, list], None]) -> None:
    """Interpret fn on inputs; visit(op, operand arrays, result arrays) after each op.
    Values are dropped after their last use, so big models fit in memory."""
    ops = fn.body.ops
    last: dict[int, int] = {}
    for i, op in enumerate(ops):
        for v in op.operands:
            last[id(v)] = i
    if len(inputs) != len(fn.args):
        raise CuvilError(f"a calibration input has {len(inputs)} arrays, the model takes {len(fn.args)}")
    try:
        dims = bind_dims(fn, inputs)
    except CuvilError as e:
        raise CuvilError(f"calibration {e}") from None
    env: dict[int, np.ndarray] = {}
    for a, x in zip(fn.args, inputs):
        env[id(a)] = np.asarray(x).astype(a.type.np_dtype, copy=False)
    for i, op in enumerate(ops):
        if op.name == "cuvil.return":
            return
        args = [env[id(v)] for v in op.operands]
        outs = evaluate_op(op, args, dims)
        visit(op, args, outs)
        for r, o in zip(op.results, outs):
            env[id(r)] = o
        for v in op.operands:
            if last.get(id(v)) == i and v.defining_op is not None and v.defining_op.name != "cuvil.constant":
                env.pop(id(v), None)


def activation_ranges(fn: Function, batches: Iterable[Sequence[np.ndarray]], watched: Sequence[Value],
                      ranges: str = "minmax", percentile: float = 99.99) -> dict[int, tuple[float, float]]:
    """(lo, hi) per watched value id, over every calibration input in `batches`."""
    if ranges not in RANGES:
        raise CuvilError(f"calibration ranges {ranges!r}: use one of {', '.join(RANGES)}")
    ids = {id(v) for v in watched}
    seen: dict[int, list[tuple[float, float]]] = {i: [] for i in ids}
    count = 0

    def visit(op, args, outs):
        for v, a in zip(op.operands, args):
            if id(v) in ids:
                if ranges == "minmax":
                    seen[id(v)].append((float(a.min()), float(a.max())))
                else:
                    lo, hi = np.percentile(a, [100.0 - percentile, percentile])
                    seen[id(v)].append((float(lo), float(hi)))
    for batch in batches:
        _walk(fn, batch, visit)
        count += 1
    if not count:
        raise CuvilError("int8 quantization needs calibration inputs: none were given")
    out = {}
    for i, spans in seen.items():
        if not spans:
            continue
        lo, hi = np.array(spans).T
        # one value may be read by several ops: each read is recorded; ranges merge.
        out[i] = (float(lo.min()), float(hi.max())) if ranges == "minmax" else (float(lo.mean()), float(hi.mean()))
    return out


def output_errors(fn: Function, batches: Iterable[Sequence[np.ndarray]], variants: dict[int, Callable]) -> dict[int, float]:
    """For ops id(op) -> make(args) returning the op's quantized output: the relative
    L2 error of that output against the f32 one (both from the f32 operands), over all
    the calibration inputs in `batches` (sqrt of summed squared errors over summed squares)."""
    num: dict[int, float] = {}
    den: dict[int, float] = {}

    def visit(op, args, outs):
        if id(op) in variants:
            ref = outs[0].astype(np.float64)
            got = variants[id(op)](args).astype(np.float64)
            num[id(op)] = num.get(id(op), 0.0) + float(np.square(got - ref).sum())
            den[id(op)] = den.get(id(op), 0.0) + float(np.square(ref).sum())
    for batch in batches:
        _walk(fn, batch, visit)
    return {i: float(np.sqrt(num[i] / max(den[i], 1e-60))) for i in num}


def input_grams(fn: Function, batches: Iterable[Sequence[np.ndarray]], ops: Sequence[Op]) -> dict[int, np.ndarray]:
    """For matmuls id(op) -> X^T X / rows (f64 [K, K]) of their operand 0 seen as rows of
    K values, summed over every calibration input (GPTQ's Hessian)."""
    ids = {id(op) for op in ops}
    grams: dict[int, np.ndarray] = {}
    rows: dict[int, int] = {}

    def visit(op, args, outs):
        if id(op) in ids:
            x = args[0].reshape(-1, args[0].shape[-1]).astype(np.float64)
            grams[id(op)] = grams.get(id(op), 0) + x.T @ x
            rows[id(op)] = rows.get(id(op), 0) + len(x)
    for batch in batches:
        _walk(fn, batch, visit)
    return {i: g / rows[i] for i, g in grams.items()}
