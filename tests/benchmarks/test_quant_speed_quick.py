"""Smoke test of benchmarks/quant_speed.py: `--quick --reps 2` in a fresh process (tiny
models; a check that the script runs end to end, not a measurement). Every model and
thread count must have a row for each of the four systems, Cuvil int8 must have run with
int8 kernels and stay close to torch, and the speed-up rows must be the medians' ratios."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "quant_speed.py"


def test_quant_speed_quick(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--reps", "2", "--threads", "1,2",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "quant_speed.json").read_text())
    rows = {(r["model"], r["threads"], r["system"]): r for r in data["rows"] if "system" in r}
    ratios = {(r["model"], r["threads"]): r for r in data["rows"] if "system" not in r}
    for model in ("resnet50", "bert-base"):
        for threads in (1, 2):
            for system in ("cuvil", "cuvil-int8", "ort", "ort-int8"):
                row = rows[(model, threads, system)]
                assert row["median_ms"] > 0 and len(row["samples_ms"]) == 2, row
            fp32, int8 = rows[(model, threads, "cuvil")], rows[(model, threads, "cuvil-int8")]
            assert fp32["rel_err_vs_torch"] < 1e-4, fp32
            assert int8["int8_ops"] > 0 and 1e-5 < int8["rel_err_vs_torch"] < 0.2, int8
            r = ratios[(model, threads)]
            assert math.isclose(r["int8_speedup_vs_cuvil_fp32"], fp32["median_ms"] / int8["median_ms"])
            assert math.isclose(r["cuvil_int8_over_ort_int8"],
                                int8["median_ms"] / rows[(model, threads, "ort-int8")]["median_ms"])
