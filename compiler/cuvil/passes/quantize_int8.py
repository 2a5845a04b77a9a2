"""The int8_sym rewrite of quantize-weights: integer conv2d / matmul from calibration.

Weights: symmetric int8 per output channel (`cuvil.dequantize {scheme = "int8_channel"}`
of an i8 constant and its f32 scales, see ir/ops/quant.py), scale = max |w| / 127.
Activations: the op's input quantized per tensor (`act_quant`), u8 asymmetric over the
calibrated [min(lo, 0), max(hi, 0)] (zero is exact: padding stays zero), or i8 symmetric
over max(|lo|, |hi|). The backend multiplies the integers with int32 accumulation and
rescales to f32 in the epilogue (bias, activation, residual follow in f32).

Candidates are the ops the int8 kernels take: a 2-D constant matmul B, a conv2d with a
GEMM shape (not depthwise). The `keep_f32` candidates with the largest relative output
error (int8 against f32, on the first calibration input) stay f32; the function's
`quantization` attribute lists them (`index` counts the candidates in program order).
"""
from __future__ import annotations

import numpy as np

from ..errors import CuvilError
from ..ir import Op
from ..ir.ops.quant import ACT_RANGES, Dequantize, as_rows, fake_quant, from_rows
from ..ir.ops.shape import Constant
from .calibrate import activation_ranges, output_errors

ACT_DTYPES = ("u8", "i8")


def int8_candidate(op: Op) -> int | None:
    """The out_axis of op's weight for int8, or None when op stays f32."""
    w = op.operands[1].type
    if op.name == "cuvil.matmul":
        return 1 if w.rank == 2 else None
    if op.name == "cuvil.conv2d":
        oc, icg, kh, kw = w.shape
        return 0 if icg * kh * kw >= 4 and oc // op.attrs["groups"] >= 4 else None
    return None


def weight_codes(w: np.ndarray, out_axis: int) -> tuple[np.ndarray, np.ndarray]:
    rows = as_rows(w.astype(np.float32), out_axis)
    scale = np.abs(rows).max(axis=1) / 127.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    return np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8), scale


def act_params(lo: float, hi: float, dtype: str) -> dict:
    if dtype == "u8":
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = (hi - lo) / 255.0 or 1.0
        zp = int(np.clip(np.rint(-lo / scale), 0, 255))
    else:
        scale = max(abs(lo), abs(hi)) / 127.0 or 1.0
        zp = 0
    return {"dtype": dtype, "scale": float(np.float32(scale)), "zero_point": zp}


def _fake_output(op: Op, aq: dict, axis: int):
    """op's output with int8 weight and activation (for the sensitivity ranking)."""
    cls, attrs = type(op), {k: v for k, v in op.attrs.items()}
    attrs["act_quant"] = aq

    def run(args):
        codes, scale = weight_codes(args[1], axis)
        w = from_rows(codes.astype(np.float32) * scale[:, None], args[1].shape, axis)
        return cls.reference([args[0], w, *args[2:]], attrs)[0]
    return run


def int8_rewrite(fn, calibration, act_dtype: str, ranges: str, percentile: float, keep_f32: int,
                 report: bool = False) -> dict:
    """Rewrite fn's candidates to int8; returns the report stored in fn.attrs. With
    `report`, it also lists every candidate (`layers`: its scales, and its output error
    against f32 over all the calibration inputs, as `cuvil quant-report` prints)."""
    if act_dtype not in ACT_DTYPES:
        raise CuvilError(f"activation dtype {act_dtype!r}: use u8 (asymmetric) or i8 (symmetric)")
    ops = []
    for op in fn.body.ops:
        if op.name not in ("cuvil.conv2d", "cuvil.matmul") or len(op.operands) < 2:
            continue
        c = op.operands[1].defining_op
        if c is None or c.name != "cuvil.constant" or op.operands[1].dtype != "f32" or op.operands[0].dtype != "f32":
            continue
        if int8_candidate(op) is not None:
            ops.append(op)
    batches = list(calibration)
    candidates = list(ops)
    found = activation_ranges(fn, batches, [op.operands[0] for op in ops], ranges, percentile)
    params = {id(op): act_params(*found[id(op.operands[0])], act_dtype) for op in ops}
    kept, errs = [], {}
    variants = {id(op): _fake_output(op, params[id(op)], int8_candidate(op)) for op in ops}
    if report and ops:
        errs = output_errors(fn, batches, variants)
    if keep_f32 and ops:  # ranked on the first calibration input
        first = output_errors(fn, batches[:1], variants)
        worst = sorted(ops, key=lambda op: -first[id(op)])[:keep_f32]
        index = {id(op): i for i, op in enumerate(ops)}
        kept = [{"op": op.name, "index": index[id(op)], "weight": list(op.operands[1].shape), "loc": op.loc,
                 "error": round(first[id(op)], 5)} for op in worst]
        ops = [op for op in ops if op not in worst]
    layers = [_layer(i, op, params[id(op)], errs.get(id(op)), op not in ops)
              for i, op in enumerate(candidates)] if report else None
    done: dict[tuple, object] = {}
    for op in ops:
        w, axis = op.operands[1], int8_candidate(op)
        c = w.defining_op
        key = (id(w), axis)
        if key not in done:
            codes, scale = weight_codes(c.value, axis)
            q = Constant(codes, f"{c.attrs['name']}.i8", c.loc)
            s = Constant(scale, f"{c.attrs['name']}.scale", c.loc)
            fn.body.insert_before(c, q)
            fn.body.insert_before(c, s)
            dq = Dequantize([q.result, s.result], {"scheme": "int8_channel", "shape": list(w.shape),
                                                   "out_axis": axis}, loc=c.loc)
            fn.body.insert_before(c, dq)
            done[key] = dq.result
        op.set_operand(1, done[key])
        op.attrs["act_quant"] = params[id(op)]
        if not w.uses:
            fn.body.erase(c)
    return {"int8_ops": len(ops), "kept_f32": kept, **({"layers": layers} if report else {})}


def _layer(index: int, op: Op, aq: dict, error: float | None, kept: bool) -> dict:
    """One candidate of the quantization report."""
    c = op.operands[1].defining_op
    _, scale = weight_codes(c.value, int8_candidate(op))
    return {"index": index, "op": op.name, "loc": op.loc, "weight": list(op.operands[1].shape),
            "weight_name": c.attrs.get("name"),
            "weight_scale": [float(scale.min()), float(scale.max())], "act_quant": dict(aq),
            "error": error, "int8": not kept}


__all__ = ["int8_rewrite", "int8_candidate", "ACT_RANGES", "fake_quant"]
