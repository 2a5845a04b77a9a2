"""int8 speed, in one run: Cuvil fp32, Cuvil int8_sym, ONNX Runtime fp32 and ONNX Runtime
dynamic int8 (`quantize_dynamic` of the same ONNX export) on ResNet-50 and BERT-base
(seq 128, batch 1), interleaved per repetition (compare.py's timing), medians and ratios.

    python benchmarks/quant_speed.py [--models resnet50,bert-base] [--threads 1,2] [--reps 10]

Cuvil int8_sym is calibrated on the benchmark input itself (one batch; the speed does
not depend on the ranges). ORT dynamic int8: QInt8 weights, per-tensor, its default op
set (MatMul / Gemm / Conv ... as ORT chooses). Writes DIR/quant_speed.json (DIR:
benchmarks/results). Ratios: int8 speed-up over Cuvil fp32, and Cuvil int8 / ORT int8
(< 1: Cuvil is faster).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [p for p in (str(BENCH_DIR), str(BENCH_DIR.parent)) if p not in sys.path]

import bench_systems as bs  # noqa: E402
from bench_models import MODELS, build  # noqa: E402
from compare import GAP_MS, machine_info, time_block  # noqa: E402

LABELS = {"cuvil": "Cuvil fp32", "cuvil-int8": "Cuvil int8_sym", "ort": "ORT fp32", "ort-int8": "ORT dynamic int8"}


class CuvilInt8Runner(bs.CuvilRunner):
    def __init__(self, module, inputs, lib_path):
        arrays = [np.ascontiguousarray(t.numpy()) for t in inputs]
        from cuvil.options import Quantization
        super().__init__(module, inputs, lib_path, system_id="cuvil-int8",
                         quantization=Quantization("int8_sym", calibration=(tuple(arrays),)))
        self.info["int8_ops"] = self.model.ir.main.attrs.get("quantization", {}).get("int8_ops")


class OrtInt8Runner(bs.OrtRunner):
    id = "ort-int8"


def ort_dynamic(fp32: Path) -> Path:
    out = fp32.with_name(fp32.stem + ".dynint8.onnx")
    if not out.is_file():
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.quantization.shape_inference import quant_pre_process
        pre = fp32.with_name(fp32.stem + ".pre.onnx")
        try:
            quant_pre_process(str(fp32), str(pre))
        except Exception:  # noqa: BLE001 - pre-processing is an optimisation only
            pre = fp32
        quantize_dynamic(str(pre), str(out), weight_type=QuantType.QInt8)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,bert-base")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="tiny models (a smoke test)")
    ap.add_argument("--out-dir", default=str(BENCH_DIR / "results"))
    ap.add_argument("--gap-ms", type=float, default=GAP_MS,
                    help=f"pause between systems' samples (default {GAP_MS:g}, as compare.py)")
    args = ap.parse_args(argv)
    args.gap = args.gap_ms / 1000
    args.sample_s, args.warm_s = (0.002 if args.quick else 0.02), (0.0 if args.quick else 0.3)
    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    import torch
    results = {"machine": machine_info(), "rows": []}
    for key in args.models.split(","):
        spec = MODELS[key]
        module, inputs, names = build(key, args.quick)
        with torch.inference_mode():
            ref = module(*inputs).detach().numpy().copy()
        feeds = {n: np.ascontiguousarray(t.numpy()) for n, t in zip(names, inputs)}
        tag = f"{key}-quick" if args.quick else key
        print(f"\n{spec.describe(args.quick)}: compiling / exporting ...", flush=True)
        onnx = out_dir / "onnx" / f"{tag}-{spec.cache_key(args.quick, torch.__version__, str(bs.OPSET))}.onnx"
        onnx.parent.mkdir(parents=True, exist_ok=True)
        (out_dir / "cuvil").mkdir(parents=True, exist_ok=True)
        bs.export_onnx(module, inputs, names, onnx)
        runners = [bs.CuvilRunner(module, inputs, out_dir / "cuvil" / f"lib{tag}.so"),
                   CuvilInt8Runner(module, inputs, out_dir / "cuvil" / f"lib{tag}-int8.so"),
                   bs.OrtRunner(onnx, feeds), OrtInt8Runner(ort_dynamic(onnx), feeds)]
        for threads in [int(t) for t in args.threads.split(",")]:
            for r in runners:
                r.prepare(threads)
            skipped: dict = {}
            with torch.inference_mode():
                timed = time_block(runners, args, skipped)
            med = {r.id: statistics.median(s) * 1e3 for r, (s, _) in timed.items()}
            print(f"  {threads} thread(s), {args.reps} interleaved reps (median ms):")
            for r in runners:
                if r.id not in med:
                    print(f"    {LABELS[r.id]:18s} skipped: {skipped.get(r.id)}")
                    continue
                out = r.output()
                err = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
                print(f"    {LABELS[r.id]:18s} {med[r.id]:9.2f} ms   rel. err vs torch {err:.3g}")
                results["rows"].append({"model": key, "threads": threads, "system": r.id, "median_ms": med[r.id],
                                        "samples_ms": [x * 1e3 for x in timed[r][0]], "rel_err_vs_torch": err,
                                        **{k: v for k, v in r.info.items() if isinstance(v, (int, float, str))}})
            if {"cuvil", "cuvil-int8", "ort-int8"} <= set(med):
                up, vs = med["cuvil"] / med["cuvil-int8"], med["cuvil-int8"] / med["ort-int8"]
                print(f"    int8 speed-up over Cuvil fp32: {up:.2f}x; Cuvil int8 / ORT int8: {vs:.2f} "
                      f"(ORT int8 speed-up over ORT fp32: {med['ort'] / med['ort-int8']:.2f}x)", flush=True)
                results["rows"].append({"model": key, "threads": threads, "int8_speedup_vs_cuvil_fp32": up,
                                        "cuvil_int8_over_ort_int8": vs})
        for r in runners:
            r.release()
    path = out_dir / "quant_speed.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
