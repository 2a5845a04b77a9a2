"""Smoke test of benchmarks/compare.py: `--quick --reps 2` in a fresh process (tiny models,
short samples; a check that the script runs end to end, not a measurement).

The JSON must have a latency row for every model x thread count x system (a peer that
cannot run here has a "skipped" row with a reason), Cuvil must have run and agree with
torch, the ratios must be Cuvil's median over the peer's, and the cold-start, GEMM and
chart outputs must be there."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "compare.py"
SYSTEMS = ["cuvil", "cuvil-bf16", "torch", "ort", "ov-f32", "ov-default"]
MODELS = ["resnet50", "mobilenetv2", "bert-base", "minilm", "mlp"]


def test_compare_quick(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--reps", "2", "--threads", "1,2",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "== Latency" in proc.stdout and "== GEMM" in proc.stdout
    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["settings"]["quick"] is True and data["settings"]["reps"] == 2

    rows = {(r["model"], r["threads"], r["system"]): r for r in data["latency"]}
    assert len(rows) == len(data["latency"]) == len(MODELS) * 2 * len(SYSTEMS)
    for model in MODELS:
        for threads in (1, 2):
            cuvil = rows[(model, threads, "cuvil")]
            assert cuvil["status"] == "ok", cuvil
            assert len(cuvil["samples_ms"]) == 2 and cuvil["median_ms"] > 0
            assert cuvil["max_rel_err_vs_torch"] < 1e-3, cuvil
            for system in SYSTEMS:
                row = rows[(model, threads, system)]
                if row["status"] != "ok":
                    assert row["status"] == "skipped" and row["reason"], row
                    continue
                assert row["median_ms"] > 0 and min(row["samples_ms"]) == row["min_ms"]
                if system == "cuvil-bf16":  # against the other reduced-precision system
                    ov = rows[(model, threads, "ov-default")]
                    if ov["status"] == "ok":
                        assert math.isclose(row["cuvil_over_system"], row["median_ms"] / ov["median_ms"])
                    assert 1e-6 < row["max_rel_err_vs_torch"] < 5e-2, row   # bf16: close, not exact
                elif system != "cuvil":
                    assert math.isclose(row["cuvil_over_system"], cuvil["median_ms"] / row["median_ms"])
            # The fp32 peers compute the same function; OpenVINO's default may use bf16.
            for system in ("torch", "ort", "ov-f32"):
                row = rows[(model, threads, system)]
                if row["status"] == "ok":
                    assert row["max_rel_err_vs_torch"] < 1e-3, row

    cold = {(r["model"], r["system"]): r for r in data["cold_start"]}
    assert set(cold) == {(m, s) for m in MODELS for s in SYSTEMS}
    for model in MODELS:
        c = cold[(model, "cuvil")]
        assert c["status"] == "ok" and c["checksum_matches_torch"], c
        assert c["cold_start_ms"] > 0 and 0 < c["peak_rss_mib"] < 200 and c["artifact_bytes"] > 0
        b = cold[(model, "cuvil-bf16")]
        assert b["status"] == "ok" and b["checksum_matches_torch"] and b["artifact_bytes"] > 0, b
        t = cold[(model, "torch")]
        assert t["status"] == "ok" and t["peak_rss_mib"] > c["peak_rss_mib"], t  # python + torch is bigger

    assert data["gemm"] and all(g["cuvil_gflops"] and g["cuvil_gflops"] > 0 for g in data["gemm"])
    assert all(g["cuvil_max_rel_err"] < 1e-4 for g in data["gemm"])
    assert {p["threads"] for p in data["peak"]} == {1, 2}
    bf16_peaks = [p for p in data["peak"] if p["isa"] == "avx512bf16"]
    if bf16_peaks:  # a CPU with vdpbf16ps: Cuvil's bf16 GEMM is measured against its peak
        assert {p["threads"] for p in bf16_peaks} == {1, 2}
        for g in data["gemm"]:
            assert g["cuvil_bf16_gflops"] > 0 and g["cuvil_bf16_efficiency"] > 0, g
            assert 1e-6 < g["cuvil_bf16_max_rel_err"] < 2e-2, g
    else:
        assert not any("cuvil_bf16_gflops" in g for g in data["gemm"])
    if data["chart"] == "compare.png":
        assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
