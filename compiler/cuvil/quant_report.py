"""`cuvil quant-report`: what quantization does to a config's model, layer by layer.

The model is captured (through the build cache) and compiled twice up to code
generation: once in fp32 and once with the config's quantization (or --quantization).
Both are run by the NumPy interpreter on the calibration inputs (the reference
semantics of every op, int8 ones included), so the report needs no native build.

For int8_sym it lists every candidate conv2d / matmul in program order: its per-channel
weight scales (smallest, largest), the activation's scale and zero point from
calibration, and its output error against f32 (relative L2 over all the calibration
inputs, the layer alone fed f32 operands); layers kept in f32 (`keep_f32`) are marked.
For a pre-quantized model (`qat_mode`) it lists the scales taken from the graph. Then, for
every method, the model's outputs against fp32: relative L2, max |difference|, the
lowest cosine similarity of a sample, and for [batch, classes] outputs top-1 agreement.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import CuvilError


def _graph_layers(fn) -> list[dict]:
    """int8 ops of a pre-quantized graph: their scales, read off the compiled module."""
    out = []
    for op in fn.body.ops:
        aq = op.attrs.get("act_quant")
        if not aq or len(op.operands) < 2:
            continue
        dq = op.operands[1].defining_op
        is_dq = dq is not None and dq.name == "cuvil.dequantize"
        scale = dq.operands[1].defining_op.value if is_dq else None
        out.append({"index": len(out), "op": op.name, "loc": op.loc, "weight": list(op.operands[1].shape),
                    "weight_name": dq.operands[0].defining_op.attrs.get("name") if is_dq else None,
                    "weight_scale": None if scale is None else [float(scale.min()), float(scale.max())],
                    "act_quant": dict(aq), "error": None, "int8": True})
    return out


def _compare(name: str, ref: list[np.ndarray], got: list[np.ndarray]) -> dict:
    r = np.concatenate([x.reshape(len(x), -1) if x.ndim > 1 else x.reshape(1, -1) for x in ref]).astype(np.float64)
    g = np.concatenate([x.reshape(len(x), -1) if x.ndim > 1 else x.reshape(1, -1) for x in got]).astype(np.float64)
    norms = np.linalg.norm(r, axis=1) * np.linalg.norm(g, axis=1)
    cos = np.where(norms > 0, (r * g).sum(1) / np.maximum(norms, 1e-300), 1.0)
    row = {"output": name, "samples": len(r),
           "rel_l2": float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-300)),
           "max_abs": float(np.abs(g - r).max()), "max_abs_ref": float(np.abs(r).max()),
           "min_cosine": float(cos.min())}
    if ref[0].ndim == 2 and ref[0].shape[1] >= 2:
        row["top1_agreement"] = float((r.argmax(1) == g.argmax(1)).mean())
    return row


def quant_report(cfg, quantization: str | None = None, max_inputs: int | None = None,
                 cache_dir: Path | None = None, log: Callable[[str], None] = print) -> dict:
    """The report as a dict (see the module docstring); progress goes to `log`."""
    from dataclasses import replace

    from .build import compile_options, optimised_module
    from .cache import Cache
    from .capture_stage import cached_capture
    from .ir.interpreter import run_function
    from .options import QUANTIZATION_METHODS, CalibrationFiles, Quantization
    from .passes.quantize_weights import weight_bytes
    from .quant_config import calibration_inputs

    opts = compile_options(cfg)
    q = replace(opts.quantization, method=quantization) if quantization else opts.quantization
    opts = opts.replace(quantization=q)
    method, qat = q.method, q.qat
    if method == "none":
        raise CuvilError("the config has no quantization (quantization.method is none): give --quantization "
                         f"{', '.join(m for m in QUANTIZATION_METHODS if m != 'none')}, or set it in the config")
    cache = Cache(cache_dir or cfg.base / ".cuvil-cache", log)
    cvir = cached_capture(cfg, cache)
    log(f"[quant-report] compiling {opts.name} with {method}" + (" (qat_mode)" if qat else ""))
    qmod, fp32_bytes = optimised_module(cvir, opts, report=True)
    fn = qmod.main
    found = fn.attrs.get("quantization") or {}
    report = {"model": opts.name, "method": method, "qat_mode": qat,
              "weight_bytes_fp32": fp32_bytes, "weight_bytes": weight_bytes(qmod), "layers": [], "outputs": []}
    if method == "int8_sym":
        report["layers"] = _graph_layers(fn) if qat else found.get("layers", [])
        if not qat:
            report["activation"] = q.activation or "u8"
            report["ranges"] = q.ranges
    pre = opts.preprocess if opts.calibration_preprocess is None else opts.calibration_preprocess
    cal = q.calibration if isinstance(q.calibration, CalibrationFiles) else CalibrationFiles()
    inputs = list(calibration_inputs(cal, fn, pre)) if q.has_calibration else []
    if max_inputs is not None:
        inputs = inputs[:max_inputs]
    report["calibration_inputs"] = len(inputs)
    if qat or not inputs:
        report["note"] = ("scales come from the model's own quantize/dequantize nodes: there is no fp32 model to "
                          "compare with" if qat else "no calibration inputs in the config: outputs not compared")
        return report
    fmod, _ = optimised_module(cvir, opts.replace(quantization=Quantization()))
    refs, gots = [], []
    for i, x in enumerate(inputs):
        log(f"[quant-report] input {i + 1}/{len(inputs)}")
        refs.append(run_function(fmod.main, x))
        gots.append(run_function(fn, x))
    report["outputs"] = [_compare(name, [r[k] for r in refs], [g[k] for g in gots])
                         for k, name in enumerate(fn.output_names)]
    return report


def _num(x, fmt="{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def format_report(r: dict) -> str:
    lines = [f"quantization report: {r['model']}, {r['method']}"
             + (" (qat_mode: scales from the model's graph)" if r["qat_mode"] else "")
             + (f", {r['activation']} activations, {r['ranges']} ranges" if "activation" in r else "")
             + f", {r['calibration_inputs']} calibration input(s)",
             f"weights: {r['weight_bytes_fp32']} bytes fp32 -> {r['weight_bytes']} bytes "
             f"({r['weight_bytes'] / max(r['weight_bytes_fp32'], 1):.3f}x)"]
    if r["layers"]:
        lines.append(f"{'#':>3}  {'op':<7} {'kind':<4} {'weight':<18} {'w scale min..max':<21} "
                     f"{'act scale':>10} {'zp':>4} {'error':>9}  where")
        for L in r["layers"]:
            ws = "-" if L["weight_scale"] is None else f"{L['weight_scale'][0]:.3g}..{L['weight_scale'][1]:.3g}"
            aq = L["act_quant"]
            lines.append(f"{L['index']:>3}  {L['op'].split('.', 1)[1]:<7} {'int8' if L['int8'] else 'f32':<4} "
                         f"{'x'.join(map(str, L['weight'])):<18} {ws:<21} {aq['scale']:>10.4g} "
                         f"{aq['zero_point']:>4} {_num(L['error'], '{:.2e}'):>9}  "
                         + " ".join(x for x in (L.get("weight_name"), L["loc"] and f"({L['loc']})") if x))
        lines.append("error: the layer's output, int8 weights and activation against f32, relative L2 over the "
                     "calibration inputs")
    for o in r["outputs"]:
        lines.append(f"output {o['output']}: rel L2 {o['rel_l2']:.3e}, max |diff| {o['max_abs']:.3g} "
                     f"(max |fp32| {o['max_abs_ref']:.3g}), min cosine {o['min_cosine']:.5f}"
                     + (f", top-1 agreement {o['top1_agreement']:.1%}" if "top1_agreement" in o else "")
                     + f" over {o['samples']} sample(s)")
    if r.get("note"):
        lines.append(f"note: {r['note']}")
    return "\n".join(lines) + "\n"


def write_json(r: dict, path: Path) -> None:
    from .fsutil import atomic_write
    atomic_write(path, json.dumps(r, indent=1, sort_keys=True) + "\n")
