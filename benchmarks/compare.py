"""Cuvil against torch eager, ONNX Runtime and OpenVINO, side by side in one run.

    python benchmarks/compare.py [--models resnet50,mobilenetv2,bert-base,minilm,mlp] [--threads 1,2]
                                 [--reps 20] [--cold-runs 5] [--quick] [--out-dir DIR]

For each model and thread count every system runs on the same inputs, interleaved
round-robin per repetition (the starting system rotates; a short pause between systems
lets the previous one's worker threads go to sleep), each sample averaging enough calls
to last ~20 ms; the table shows medians and the ratio Cuvil / system (< 1: Cuvil is
faster) and each system's largest difference from torch eager's output. Then per model
and system: cold start-to-first-result time and peak RSS of a fresh process that loads
the artifact and runs once, and the artifact's size. Then GEMM GFLOP/s: Cuvil (an
nn.Linear without bias) vs numpy vs the measured FMA peak of the same thread count.

Systems: Cuvil (`cuvil.compile`: the shared library that `cuvil link --kind shared`
makes, called through its C API), Cuvil bf16 (the same with `Quantization(precision="bf16")`; its
ratio is against OpenVINO default, the other reduced-precision system), torch eager, ONNX Runtime fp32 (CPU provider, intra-op
threads = N, inter-op 1), OpenVINO with INFERENCE_PRECISION_HINT=f32 (the fp32 peer) and
OpenVINO default (bf16 where the CPU has AMX). The ONNX file comes from
`torch.onnx.export(..., dynamo=True)` at opset 20, cached under the output directory.
A system that cannot be installed, exported or run gets a "skipped: reason" row.

Writes DIR/compare.json and DIR/compare.png (DIR: benchmarks/results), and the tables
of the run as Markdown with its commit, machine and command to `--results PATH`
(default benchmarks/RESULTS.md; a `--quick` run writes it only where --results is
given, `--no-results` never). Numbers vary with the machine and its load: compare
within one run. `--quick` uses tiny models (a smoke test, not a measurement).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path[:0] = [p for p in (str(BENCH_DIR), str(ROOT)) if p not in sys.path]

import bench_gemm  # noqa: E402
import bench_systems as bs  # noqa: E402
from bench_models import MODELS, build  # noqa: E402

GEMM_SHAPES = [(1024, 1024, 1024), (128, 768, 768), (128, 768, 3072), (128, 3072, 768)]
GEMM_SHAPES_QUICK = [(64, 64, 64), (16, 64, 128)]


# Pause between systems' samples: ONNX Runtime's intra-op threads (and torch's OpenMP ones)
# spin on a core for a while after each run; with 5 ms the next 2-thread system lost up to
# half its speed.
GAP_MS = 100.0

# The current results table (Markdown), rewritten by every full run.
RESULTS_MD = BENCH_DIR / "RESULTS.md"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--systems", default=",".join(s for s, _ in bs.SYSTEMS),
                    help=f"comma list of {', '.join(s for s, _ in bs.SYSTEMS)}")
    ap.add_argument("--threads", default="1,2", help="comma list of thread counts")
    ap.add_argument("--reps", type=int, default=20, help="interleaved repetitions per model and thread count")
    ap.add_argument("--cold-runs", type=int, default=None, help="fresh processes per system (default 5, quick 1)")
    ap.add_argument("--quick", action="store_true", help="tiny models and short samples (smoke test)")
    ap.add_argument("--no-gemm", action="store_true", help="skip the GEMM section")
    ap.add_argument("--no-cold", action="store_true", help="skip cold start / peak RSS")
    ap.add_argument("--gap-ms", type=float, default=None,
                    help=f"pause between systems' samples (default {GAP_MS:g}, quick 5)")
    ap.add_argument("--out-dir", default=str(BENCH_DIR / "results"))
    ap.add_argument("--results", default=None, metavar="PATH",
                    help=f"write the run's tables as Markdown here (default {RESULTS_MD.relative_to(ROOT)}; "
                         "with --quick only when given)")
    ap.add_argument("--no-results", action="store_true", help="write no Markdown results file")
    args = ap.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for m in args.models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r} (known: {', '.join(MODELS)})")
    for s in args.systems:
        if s not in bs.LABELS:
            ap.error(f"unknown system {s!r} (known: {', '.join(bs.LABELS)})")
    try:
        args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--threads takes a comma list of integers, got {args.threads!r}")
    if not args.threads or min(args.threads) < 1 or args.reps < 1 or (args.cold_runs or 1) < 1:
        ap.error("--threads must be positive integers, --reps and --cold-runs at least 1")
    args.cold_runs = args.cold_runs if args.cold_runs is not None else (1 if args.quick else 5)
    args.gap = (args.gap_ms if args.gap_ms is not None else (5.0 if args.quick else GAP_MS)) / 1000
    args.sample_s = 0.002 if args.quick else 0.02   # each sample averages calls lasting about this long
    # A GEMM sample is one parallel loop per call: the other thread must be awake for every
    # call, which short samples right after a pause (a sleeping vCPU) often miss.
    args.gemm_sample_s = 0.002 if args.quick else 0.1
    args.warm_s = 0.0 if args.quick else 0.3        # warm-up per system and thread count
    args.peak_s = 0.01 if args.quick else 0.1
    args.out_dir = Path(args.out_dir).resolve()
    if args.no_results:
        args.results = None
    elif args.results is not None:
        args.results = Path(args.results).resolve()
    elif not args.quick:  # a smoke test is not a measurement: it leaves RESULTS.md alone
        args.results = RESULTS_MD
    return args


# --- helpers ---------------------------------------------------------------------------

def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "loadavg_start": os.getloadavg(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
        flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
        info["cpu"] = model
        info["isa"] = sorted(flags & {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile",
                                      "amx_bf16", "amx_int8", "hypervisor"})
    except OSError:
        pass
    try:
        info["git"] = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                                     capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    versions = {"numpy": np.__version__}
    for mod in ("torch", "onnxruntime", "openvino", "onnxscript", "llvmlite"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001 - an absent peer is a row, not a crash
            versions[mod] = f"unavailable ({bs.short(exc, 80)})"
    info["versions"] = versions
    return info


def measure_process(cmd: list[str], launcher: Path | None) -> tuple[float, float | None, str]:
    """(wall seconds, peak RSS MiB, stdout) of one fresh process; RuntimeError if it fails.

    Started through the small `coldstart` launcher: Linux keeps the peak RSS across
    exec, so a process forked from this (large) one would report this one's size. Without
    the launcher the RSS is None."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as result:
        start = time.perf_counter()
        proc = subprocess.Popen([str(launcher), result.name, *cmd] if launcher else cmd,
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        _, status, _ = os.wait4(proc.pid, 0)
        wall, rss = time.perf_counter() - start, None
        code = os.waitstatus_to_exitcode(status)
        if launcher:
            fields = result.read().split()
            if len(fields) == 3:
                wall, rss, code = float(fields[0]), int(fields[1]) / 1024.0, int(fields[2])
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if code != 0:
        tail = stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"exit {code}: {tail[0][:200]}")
    return wall, rss, stdout


def cpu_clock() -> tuple[float, float, float] | None:
    """(wall s, machine-wide busy CPU s, this process's CPU s), to tell how many CPUs other
    processes kept busy meanwhile (a run on a loaded machine is not a measurement)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
    t = os.times()
    return time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), t.user + t.system


def background_cpus(start, end) -> float | None:
    if start is None or end is None or end[0] <= start[0]:
        return None
    return max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / (end[0] - start[0]))


def fmt_ms(ms: float) -> str:
    return f"{ms:.3g}" if ms < 1 else f"{ms:.1f}" if ms >= 100 else f"{ms:.2f}"


def fmt_size(nbytes: float) -> str:
    return f"{nbytes / 2**10:.1f} KiB" if nbytes < 2**20 else f"{nbytes / 2**20:.1f} MiB"


# --- per model ---------------------------------------------------------------------------

def setup_model(key: str, args, tools: dict) -> tuple[dict, list, dict]:
    """Build the model, its reference output, the artifacts and a runner per system.
    Returns (context, runners, skipped {system: reason})."""
    import torch
    spec = MODELS[key]
    tag = f"{key}-quick" if args.quick else key
    module, inputs, names = build(key, args.quick)
    with torch.inference_mode():
        ref = module(*inputs).detach().numpy().copy()
    data = args.out_dir / "inputs" / tag
    data.mkdir(parents=True, exist_ok=True)
    npys, bins = [], []
    for name, t in zip(names, inputs):
        arr = np.ascontiguousarray(t.numpy())
        np.save(data / f"{name}.npy", arr)
        (data / f"{name}.bin").write_bytes(arr.tobytes())
        npys.append(data / f"{name}.npy")
        bins.append(data / f"{name}.bin")
    weights = args.out_dir / "torch" / f"{tag}.pt"
    weights.parent.mkdir(parents=True, exist_ok=True)
    torch.save(module.state_dict(), weights)
    ctx = {"key": key, "tag": tag, "names": names, "npys": npys, "bins": bins, "weights": weights,
           "ref": ref, "onnx": None, "library": None, "prefix": None}
    runners, skipped = [], {}
    feeds = {n: np.ascontiguousarray(t.numpy()) for n, t in zip(names, inputs)}

    def add(system: str, make):
        if system not in args.systems:
            return None
        try:
            runner = make()
        except bs.Skip as exc:
            skipped[system] = str(exc)
            return None
        except Exception as exc:  # noqa: BLE001 - one system failing must not stop the others
            skipped[system] = f"setup failed: {bs.short(exc)}"
            return None
        runners.append(runner)
        return runner

    lib_dir = args.out_dir / "cuvil"
    lib_dir.mkdir(parents=True, exist_ok=True)
    print("  compiling with Cuvil ...", flush=True)
    t0 = time.perf_counter()
    cuvil_runner = add("cuvil", lambda: bs.CuvilRunner(module, inputs, lib_dir / f"lib{tag}.so"))
    if cuvil_runner is not None:
        ctx["library"], ctx["prefix"] = cuvil_runner.library, cuvil_runner.prefix
        cuvil_runner.info["compile_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    bf16_runner = add("cuvil-bf16", lambda: bs.CuvilRunner(module, inputs, lib_dir / f"lib{tag}-bf16.so", "bf16"))
    ctx["library_bf16"], ctx["prefix_bf16"] = None, None
    if bf16_runner is not None:
        ctx["library_bf16"], ctx["prefix_bf16"] = bf16_runner.library, bf16_runner.prefix
        bf16_runner.info["compile_s"] = time.perf_counter() - t0
    add("torch", lambda: bs.TorchRunner(module, inputs))
    if {"ort", "ov-f32", "ov-default"} & set(args.systems):
        onnx = args.out_dir / "onnx" / f"{tag}-{spec.cache_key(args.quick, torch.__version__, str(bs.OPSET))}.onnx"
        onnx.parent.mkdir(parents=True, exist_ok=True)
        try:
            if not onnx.is_file():
                print(f"  exporting ONNX (dynamo, opset {bs.OPSET}) ...", flush=True)
            ctx["onnx"] = bs.export_onnx(module, inputs, names, onnx)
        except bs.Skip as exc:
            for s in ("ort", "ov-f32", "ov-default"):
                skipped[s] = str(exc)
        if ctx["onnx"] is not None:
            add("ort", lambda: bs.OrtRunner(ctx["onnx"], feeds))
            add("ov-f32", lambda: bs.OvRunner(ctx["onnx"], feeds, fp32=True))
            add("ov-default", lambda: bs.OvRunner(ctx["onnx"], feeds, fp32=False))
    return ctx, runners, skipped


def time_block(runners, args, skipped: dict) -> dict:
    """Interleaved samples: {runner: [seconds per call, ...]} (failing runners are moved
    to `skipped`)."""
    inner, live = {}, []
    for r in runners:
        try:
            r.call()
            t0, n = time.perf_counter(), 0
            while True:
                r.call()
                n += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= args.warm_s:
                    break
            inner[r] = max(1, round(args.sample_s / (elapsed / n)))
            live.append(r)
        except Exception as exc:  # noqa: BLE001
            skipped[r.id] = f"run failed: {bs.short(exc)}"
    samples = {r: [] for r in live}
    gc.collect()
    gc.disable()
    try:
        for rep in range(args.reps):
            k = rep % max(len(live), 1)
            for r in live[k:] + live[:k]:
                if args.gap:
                    time.sleep(args.gap)
                n = inner[r]
                try:
                    t0 = time.perf_counter()
                    for _ in range(n):
                        r.call()
                    samples[r].append((time.perf_counter() - t0) / n)
                except Exception as exc:  # noqa: BLE001
                    skipped[r.id] = f"run failed: {bs.short(exc)}"
                    live.remove(r)
                    del samples[r]
    finally:
        gc.enable()
    return {r: (s, inner[r]) for r, s in samples.items()}


def run_model(key: str, args, tools: dict, results: dict) -> None:
    import torch
    spec = MODELS[key]
    print(f"\n{spec.describe(args.quick)}", flush=True)
    ctx, runners, skipped = setup_model(key, args, tools)
    ref = ctx["ref"]
    for threads in args.threads:
        block_skips = dict(skipped)
        live = []
        for r in runners:
            try:
                r.prepare(threads)
                live.append(r)
            except Exception as exc:  # noqa: BLE001
                block_skips[r.id] = f"setup for {threads} threads failed: {bs.short(exc)}"
        print(f"  {threads} thread(s): {args.reps} interleaved reps of {', '.join(bs.LABELS[r.id] for r in live)}",
              flush=True)
        clock = cpu_clock()
        with torch.inference_mode():
            timed = time_block(live, args, block_skips)
        background = background_cpus(clock, cpu_clock())
        if background is not None:
            print(f"    other processes kept {background:.2f} CPUs busy meanwhile", flush=True)
        rows = {}
        for r, (samples, inner) in timed.items():
            out = r.output()
            err = float(np.abs(out.astype(np.float64) - ref).max()) if out.shape == ref.shape else float("nan")
            rows[r.id] = {"status": "ok", "median_ms": statistics.median(samples) * 1e3,
                          "min_ms": min(samples) * 1e3, "samples_ms": [s * 1e3 for s in samples],
                          "calls_per_sample": inner, "max_abs_err_vs_torch": err,
                          "max_rel_err_vs_torch": err / max(float(np.abs(ref).max()), 1e-30),
                          "call_path": r.call_path, "background_cpus": background,
                          **{k: v for k, v in r.info.items() if v is not None}}
        cuvil = rows.get("cuvil")
        for system, _ in bs.SYSTEMS:
            if system not in args.systems:
                continue
            row = {"model": key, "title": spec.describe(args.quick), "threads": threads,
                   "system": system, "label": bs.LABELS[system]}
            if system in rows:
                row.update(rows[system])
                if system == "cuvil-bf16":  # the reduced-precision peer
                    if "ov-default" in rows:
                        row["cuvil_over_system"] = row["median_ms"] / rows["ov-default"]["median_ms"]
                        row["ratio_against"] = "ov-default"
                elif cuvil is not None and system != "cuvil":
                    row["cuvil_over_system"] = cuvil["median_ms"] / row["median_ms"]
            else:
                row.update(status="skipped", reason=block_skips.get(system, "not run"))
            results["latency"].append(row)
    if not args.no_cold:
        cold_starts(key, ctx, args, tools, skipped, results)
    for r in runners:
        r.release()
    del runners
    gc.collect()


def cold_starts(key: str, ctx: dict, args, tools: dict, skipped: dict, results: dict) -> None:
    threads = max(args.threads)
    cmds, rows = {}, {}
    for system, _ in bs.SYSTEMS:
        if system not in args.systems:
            continue
        rows[system] = {"model": key, "system": system, "label": bs.LABELS[system], "threads": threads}
        if system in skipped:
            rows[system].update(status="skipped", reason=skipped[system])
            continue
        try:
            cmds[system] = bs.cold_command(
                system, key=key, quick=args.quick, threads=threads, names=ctx["names"], npys=ctx["npys"],
                bins=ctx["bins"], onnx=ctx["onnx"], weights=ctx["weights"],
                library=ctx["library_bf16"] if system == "cuvil-bf16" else ctx["library"],
                prefix=ctx["prefix_bf16"] if system == "cuvil-bf16" else ctx["prefix"],
                cuvil_run=tools.get("cuvil_run"))
        except bs.Skip as exc:
            rows[system].update(status="skipped", reason=str(exc))
    print(f"  cold start: {args.cold_runs} fresh process(es) per system at {threads} thread(s)"
          f"{'' if args.quick else ' after a warm-up one'}", flush=True)
    samples = {s: [] for s in cmds}
    ref_sum = float(ctx["ref"].astype(np.float64).sum())
    ref_abs = float(np.abs(ctx["ref"]).astype(np.float64).sum())
    for system in list(cmds):  # a first run each: warms the page cache, checks the command
        try:
            wall, rss, out = measure_process(cmds[system], tools.get("coldstart"))
            if args.quick:  # a smoke test: the first run is the sample
                samples[system].append((wall, rss))
            value = float(out.split()[-1])
            rows[system]["checksum"] = value
            rows[system]["checksum_matches_torch"] = abs(value - ref_sum) <= 2e-2 * ref_abs + 1e-6
        except Exception as exc:  # noqa: BLE001
            rows[system].update(status="failed", reason=bs.short(exc))
            del cmds[system]
    for _ in range(args.cold_runs - (1 if args.quick else 0)):
        for system, cmd in list(cmds.items()):
            try:
                samples[system].append(measure_process(cmd, tools.get("coldstart"))[:2])
            except Exception as exc:  # noqa: BLE001
                rows[system].update(status="failed", reason=bs.short(exc))
                del cmds[system]
    for system, row in rows.items():
        files = bs.artifact_files(system, onnx=ctx["onnx"], weights=ctx["weights"],
                                  library=ctx["library_bf16"] if system == "cuvil-bf16" else ctx["library"])
        if files and all(f.is_file() for f in files):
            row["artifact_bytes"] = sum(f.stat().st_size for f in files)
            row["artifact_files"] = [f.name for f in files]
        if system in cmds and samples[system]:
            rss = [r for _, r in samples[system] if r is not None]
            row.update(status="ok", cold_start_ms=statistics.median(w for w, _ in samples[system]) * 1e3,
                       peak_rss_mib=statistics.median(rss) if rss else None, runs=len(samples[system]))
        results["cold_start"].append(row)


# --- GEMM ---------------------------------------------------------------------------------

OPENBLAS_SPIN_S = 0.3
GEMM_WARMUP_S = 0.05


def run_gemm(args, tools: dict, results: dict) -> None:
    shapes = GEMM_SHAPES_QUICK if args.quick else GEMM_SHAPES
    print(f"\nGEMM fp32 {', '.join('x'.join(map(str, s)) for s in shapes)} (M x K x N)", flush=True)
    cuvil, skipped, cuvil_bf16 = {}, {}, {}
    for shape in shapes:
        try:
            cuvil[shape] = bench_gemm.CuvilGemm(*shape)
        except Exception as exc:  # noqa: BLE001
            skipped[shape] = f"Cuvil compile failed: {bs.short(exc)}"
    peak_exe = tools.get("fma_peak")
    sample_s = args.gemm_sample_s
    bf16_peak = False  # Cuvil's precision bf16 GEMM, where the CPU has vdpbf16ps to measure it against
    if peak_exe and "cuvil-bf16" in args.systems:
        try:
            bench_gemm.fma_peak(peak_exe, 1, 0.01, bf16=True)
            bf16_peak = True
        except Exception as exc:  # noqa: BLE001
            results["gemm_info"]["bf16"] = f"skipped: no bf16 peak ({bs.short(exc)})"
    for shape in shapes if bf16_peak else ():
        try:
            cuvil_bf16[shape] = bench_gemm.CuvilGemm(*shape, precision="bf16")
        except Exception as exc:  # noqa: BLE001
            results["gemm_info"][f"bf16 {shape}"] = f"Cuvil bf16 compile failed: {bs.short(exc)}"
    compiled = (("cuvil", cuvil), ("cuvil-bf16", cuvil_bf16))
    for threads in args.threads:
        try:
            worker = bench_gemm.NumpyWorker(threads)
        except Exception as exc:  # noqa: BLE001
            worker, numpy_reason = None, f"numpy worker failed: {bs.short(exc)}"
        results["gemm_info"][f"numpy_openblas_core_{threads}t"] = worker.core if worker else numpy_reason
        inner = {}  # calls per sample: enough for ~sample_s, from one timed call
        for who, models in compiled:
            for shape, g in models.items():
                g.set_threads(threads)
                t0 = time.perf_counter()
                g.call()
                inner[(who, shape)] = max(1, round(sample_s / max(time.perf_counter() - t0, 1e-7)))
        for shape in shapes if worker else ():
            once = worker.time(*shape, 1)
            inner[("numpy", shape)] = max(1, round(sample_s / max(once, 1e-7)))
        samples = {key: [] for key in inner}
        peaks, isa, peaks_bf16 = [], None, []
        for _ in range(args.reps):
            if peak_exe:
                gflops, isa = bench_gemm.fma_peak(peak_exe, threads, args.peak_s)
                peaks.append(gflops)
            if bf16_peak:
                peaks_bf16.append(bench_gemm.fma_peak(peak_exe, threads, args.peak_s, bf16=True)[0])
            for shape in shapes:
                for who, models in compiled:
                    if shape not in models:
                        continue
                    g, n = models[shape], inner[(who, shape)]
                    warm = time.perf_counter()  # untimed calls first (the numpy worker does one too):
                    while time.perf_counter() - warm < GEMM_WARMUP_S:  # idle cores wake up slowly
                        g.call()
                    t0 = time.perf_counter()
                    for _ in range(n):
                        g.call()
                    samples[(who, shape)].append((time.perf_counter() - t0) / n)
                if worker:
                    samples[("numpy", shape)].append(worker.time(*shape, inner[("numpy", shape)]))
                    # OpenBLAS's threads spin ~0.1 s after a call: let them sleep before
                    # the next Cuvil sample, or they take one of its cores
                    time.sleep(OPENBLAS_SPIN_S)
        if worker:
            worker.close()
        peak = statistics.median(peaks) if peaks else None
        results["peak"].append({"threads": threads, "gflops": peak, "max_gflops": max(peaks) if peaks else None,
                                "isa": isa, "status": "ok" if peaks else "skipped",
                                "reason": None if peaks else tools.get("fma_peak_error")})
        peak_bf16 = statistics.median(peaks_bf16) if peaks_bf16 else None
        if peaks_bf16:
            results["peak"].append({"threads": threads, "gflops": peak_bf16, "max_gflops": max(peaks_bf16),
                                    "isa": "avx512bf16", "status": "ok", "reason": None})
        for shape in shapes:
            m, k, n = shape
            flop = 2.0 * m * k * n
            row = {"m": m, "k": k, "n": n, "threads": threads, "peak_gflops": peak}
            for who in ("cuvil", "numpy"):
                s = samples.get((who, shape))
                row[f"{who}_gflops"] = flop / statistics.median(s) / 1e9 if s else None
            if shape in skipped:
                row["cuvil_reason"] = skipped[shape]
            if not worker:
                row["numpy_reason"] = numpy_reason
            if shape in cuvil:
                row["cuvil_max_rel_err"] = cuvil[shape].max_rel_err
            for who in ("cuvil", "numpy"):
                if peak and row[f"{who}_gflops"]:
                    row[f"{who}_efficiency"] = row[f"{who}_gflops"] / peak
            if row["cuvil_gflops"] and row["numpy_gflops"]:
                row["cuvil_over_numpy"] = row["cuvil_gflops"] / row["numpy_gflops"]
            s_bf16 = samples.get(("cuvil-bf16", shape))
            if s_bf16:
                row["cuvil_bf16_gflops"] = flop / statistics.median(s_bf16) / 1e9
                row["bf16_peak_gflops"] = peak_bf16
                row["cuvil_bf16_efficiency"] = row["cuvil_bf16_gflops"] / peak_bf16
                row["cuvil_bf16_max_rel_err"] = cuvil_bf16[shape].max_rel_err
            results["gemm"].append(row)


# --- report -------------------------------------------------------------------------------

def print_report(results: dict, args) -> None:
    s = results["settings"]
    print(f"\n== Latency, batch 1: median ms of {s['reps']} interleaved reps; "
          f"(x) = Cuvil fp32 / system (Cuvil bf16 / OpenVINO default on the bf16 row), "
          f"< 1 means Cuvil is faster ==")
    head = f"{'model':<14} {'system':<17}" + "".join(f" {f'{t} thread' + ('s' if t > 1 else ''):>18}"
                                                    for t in s["threads"]) + "  max|err| vs torch"
    print(head)
    for key in s["models"]:
        first = True
        for system, label in bs.SYSTEMS:
            rows = [r for r in results["latency"] if r["model"] == key and r["system"] == system]
            if not rows:
                continue
            line, first = f"{key if first else '':<14} {label:<17}", False
            skipped = [r for r in rows if r["status"] != "ok"]
            if len(skipped) == len(rows):
                print(line + f" skipped: {skipped[0]['reason']}")
                continue
            errs = []
            for t in s["threads"]:
                r = next((r for r in rows if r["threads"] == t), None)
                if r is None or r["status"] != "ok":
                    cell = "skipped"
                else:
                    ratio = r.get("cuvil_over_system")
                    cell = fmt_ms(r["median_ms"]) + (f" ({ratio:.2f})" if ratio is not None else "")
                    errs.append(r["max_abs_err_vs_torch"])
                line += f" {cell:>18}"
            extra = f"  {max(errs):.2g}" if errs else ""
            prec = next((r.get("inference_precision") for r in rows if r.get("inference_precision")), None)
            print(line + extra + (f"  [{prec}]" if prec else ""))
        busy = []
        for t in s["threads"]:
            b = next((r["background_cpus"] for r in results["latency"] if r["model"] == key and r["threads"] == t
                      and r.get("background_cpus") is not None), None)
            if b is not None:
                busy.append(f"{b:.2f} at {t} thread{'s' if t > 1 else ''}")
        if busy:
            print(f"{'':<14} (CPUs kept busy by other processes: {', '.join(busy)})")
    if results["cold_start"]:
        t = max(s["threads"])
        print(f"\n== Cold start: fresh process loads the artifact and runs once ({t} thread{'s' if t > 1 else ''}; "
              f"median of {s['cold_runs']}) ==")
        print(f"{'model':<14} {'system':<17} {'start-to-result':>16} {'peak RSS':>12} {'artifact':>12}")
        for key in s["models"]:
            first = True
            for system, label in bs.SYSTEMS:
                r = next((r for r in results["cold_start"] if r["model"] == key and r["system"] == system), None)
                if r is None:
                    continue
                line, first = f"{key if first else '':<14} {label:<17}", False
                size = fmt_size(r["artifact_bytes"]) if "artifact_bytes" in r else "-"
                if r.get("status") == "ok":
                    rss = f"{r['peak_rss_mib']:.1f} MiB" if r.get("peak_rss_mib") is not None else "-"
                    line += f" {r['cold_start_ms']:13.1f} ms {rss:>12} {size:>12}"
                else:
                    line += f" {r.get('status')}: {r.get('reason')}"
                print(line)
    if results["gemm"]:
        print("\n== GEMM fp32 GFLOP/s (median); efficiency = GFLOP/s / measured FMA peak of the same "
              "thread count ==")
        for p in results["peak"]:
            if p["status"] == "ok":
                kind = "bf16 dot-product peak" if p["isa"] == "avx512bf16" else "FMA peak"
                print(f"{kind}, {p['threads']} thread(s): {p['gflops']:.1f} GFLOP/s median, "
                      f"{p['max_gflops']:.1f} max ({p['isa']})")
            else:
                print(f"FMA peak, {p['threads']} thread(s): skipped: {p['reason']}")
        print(f"{'M x K x N':<16} {'thr':>3} {'Cuvil':>9} {'numpy':>9} {'Cuvil eff':>10} {'numpy eff':>10} "
              f"{'Cuvil/numpy':>12}")
        for r in results["gemm"]:
            def g(v, f="{:.1f}"):
                return f.format(v) if v is not None else "-"
            shape = f"{r['m']}x{r['k']}x{r['n']}"
            print(f"{shape:<16} {r['threads']:>3} {g(r['cuvil_gflops']):>9} "
                  f"{g(r['numpy_gflops']):>9} {g(r.get('cuvil_efficiency'), '{:.0%}'):>10} "
                  f"{g(r.get('numpy_efficiency'), '{:.0%}'):>10} {g(r.get('cuvil_over_numpy'), '{:.2f}'):>12}")
            if r.get("cuvil_reason"):
                print(f"{'':<20} Cuvil skipped: {r['cuvil_reason']}")
            if r.get("cuvil_bf16_gflops"):
                vs_fp32 = f", {r['cuvil_bf16_gflops'] / r['cuvil_gflops']:.2f}x Cuvil fp32" if r["cuvil_gflops"] else ""
                print(f"{'':<20} Cuvil bf16 {r['cuvil_bf16_gflops']:.1f} GFLOP/s = "
                      f"{r['cuvil_bf16_efficiency']:.0%} of the bf16 peak{vs_fp32}")
        for key, note in results["gemm_info"].items():
            if key == "bf16" or key.startswith("bf16 "):
                print(f"Cuvil bf16 GEMM: {note}")
    m = results["machine"]
    print(f"\nmachine: {m.get('cpu', '?')}, {m.get('affinity')} CPUs, load average "
          f"{m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end")


def write_chart(results: dict, path: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"matplotlib unavailable: {bs.short(exc)}"
    s = results["settings"]
    panels = list(s["models"]) + (["gemm"] if results["gemm"] else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False)
    colors = dict(zip([k for k, _ in bs.SYSTEMS], ["#d62728", "#ff9896", "#7f7f7f", "#1f77b4", "#2ca02c", "#98df8a"]))
    for ax, panel in zip(axes[0], panels):
        if panel == "gemm":
            shapes = list(dict.fromkeys((r["m"], r["k"], r["n"]) for r in results["gemm"]))
            whos = ("cuvil", "numpy") + (("cuvil_bf16",) if any(r.get("cuvil_bf16_gflops") for r in results["gemm"])
                                         else ())
            series = [(who, t) for t in s["threads"] for who in whos]
            width = 0.8 / len(series)
            for j, (who, t) in enumerate(series):
                vals = [next((r.get(f"{who}_gflops") or 0 for r in results["gemm"]
                              if (r["m"], r["k"], r["n"]) == sh and r["threads"] == t), 0) for sh in shapes]
                label, color = {"cuvil": ("Cuvil", colors["cuvil"]), "numpy": ("numpy", "#ff7f0e"),
                                "cuvil_bf16": ("Cuvil bf16", colors["cuvil-bf16"])}[who]
                ax.bar([i + (j - (len(series) - 1) / 2) * width for i in range(len(shapes))], vals, width,
                       label=f"{label} {t}t", color=color, alpha=0.5 + 0.5 * (t == s["threads"][0]))
            for p in results["peak"]:
                if p["gflops"]:
                    bf = p["isa"] == "avx512bf16"
                    ax.axhline(p["gflops"], ls=":" if bf else "--", lw=1, color="k")
                    ax.text(len(shapes) - 0.5, p["gflops"], f"{'bf16' if bf else 'FMA'} peak {p['threads']}t",
                            ha="right", va="bottom", fontsize=7)
            ax.set_xticks(range(len(shapes)), [f"{m}x{k}x{n}" for m, k, n in shapes], fontsize=7, rotation=15)
            ax.set_ylabel("GFLOP/s")
            ax.set_title("GEMM (fp32; bf16 where measured)", fontsize=9)
            ax.legend(fontsize=7)
            continue
        rows = [r for r in results["latency"] if r["model"] == panel and r["status"] == "ok"]
        systems = [k for k, _ in bs.SYSTEMS if any(r["system"] == k for r in rows)]
        width = 0.8 / max(len(systems), 1)
        for j, system in enumerate(systems):
            xs, ys = [], []
            for i, t in enumerate(s["threads"]):
                r = next((r for r in rows if r["system"] == system and r["threads"] == t), None)
                if r:
                    xs.append(i + (j - (len(systems) - 1) / 2) * width)
                    ys.append(r["median_ms"])
            bars = ax.bar(xs, ys, width, label=bs.LABELS[system], color=colors[system])
            for b, y in zip(bars, ys):
                ax.text(b.get_x() + b.get_width() / 2, y, fmt_ms(y), ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(s["threads"])), [f"{t} thread{'s' if t > 1 else ''}" for t in s["threads"]])
        ax.set_ylabel("median latency, ms (lower is better)")
        ax.set_title(MODELS[panel].describe(s["quick"]), fontsize=9, wrap=True)
        ax.legend(fontsize=7)
    m = results["machine"]
    fig.suptitle(f"Cuvil vs peers, batch 1 ({m.get('cpu', '?')}, {m.get('date', '')})", fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return None


# --- RESULTS.md ---------------------------------------------------------------------------

def _md_ms(row: dict | None) -> str:
    if row is None:
        return "-"
    if row.get("status") != "ok":
        return "skipped"
    return fmt_ms(row["median_ms"])


def _md_threads(values: list[str]) -> str:
    return " / ".join(values) if any(v != "-" for v in values) else "-"


def results_markdown(results: dict, command: str) -> str:
    """The run's tables as Markdown: commit, date, machine, versions and command first,
    then latency (median ms per thread count), Cuvil's ratios against its peers, GEMM
    and cold start. Sections without rows are left out."""
    m, s = results["machine"], results["settings"]
    threads = list(s["threads"])
    systems = [(k, label) for k, label in bs.SYSTEMS if k in s["systems"]]
    isa = ", ".join(m.get("isa") or []) or "?"
    versions = ", ".join(f"{k} {v}" for k, v in (m.get("versions") or {}).items())
    lines = [
        "# Benchmark results",
        "",
        "Written by `benchmarks/compare.py` at the end of a run (`--results PATH`, default this",
        "file): edit the script, not this file. Systems are interleaved within the run, so",
        "compare the columns of one table; numbers from other runs or machines do not compare.",
        "",
        f"- commit: `{m.get('git', '?')}`",
        f"- date: {m.get('date', '?')}",
        f"- machine: {m.get('cpu', '?')}, {m.get('affinity', '?')} CPUs ({isa})"
        + (f"; {m['platform']}" if m.get("platform") else ""),
        f"- versions: {versions or '?'}",
        f"- command: `{command}`",
        f"- settings: {s['reps']} interleaved repetitions per model and thread count, "
        f"{s['gap_s'] * 1000:g} ms between systems, medians" + (" (--quick: tiny models)" if s.get("quick") else ""),
        "",
    ]
    rows = {(r["model"], r["threads"], r["system"]): r for r in results["latency"]}
    if results["latency"]:
        head = " / ".join(str(t) for t in threads)
        lines += [f"## Latency, batch 1: median ms at {head} thread(s)", "",
                  "| model | " + " | ".join(label for _, label in systems) + " |",
                  "|---" * (len(systems) + 1) + "|"]
        for key in s["models"]:
            title = next((r.get("title") for r in results["latency"] if r["model"] == key and r.get("title")), key)
            cells = [_md_threads([_md_ms(rows.get((key, t, k))) for t in threads]) for k, _ in systems]
            lines.append(f"| {title} | " + " | ".join(cells) + " |")
        pairs = [("cuvil", "ort"), ("cuvil", "ov-f32"), ("cuvil-bf16", "ov-default")]
        pairs = [(a, b) for a, b in pairs if a in s["systems"] and b in s["systems"]]
        if pairs:
            lines += ["", f"Ratios, Cuvil / peer at {head} thread(s) (< 1: Cuvil is faster):", "",
                      "| model | " + " | ".join(f"{bs.LABELS[a]} / {bs.LABELS[b]}" for a, b in pairs) + " |",
                      "|---" * (len(pairs) + 1) + "|"]
            for key in s["models"]:
                title = next((r.get("title") for r in results["latency"]
                              if r["model"] == key and r.get("title")), key)
                cells = []
                for a, b in pairs:
                    vals = []
                    for t in threads:
                        ra, rb = rows.get((key, t, a)), rows.get((key, t, b))
                        ok = ra and rb and ra.get("status") == rb.get("status") == "ok"
                        vals.append(f"{ra['median_ms'] / rb['median_ms']:.2f}" if ok else "-")
                    cells.append(_md_threads(vals))
                lines.append(f"| {title} | " + " | ".join(cells) + " |")
        lines.append("")
    if results["gemm"]:
        peaks = {(p["threads"], p["isa"] == "avx512bf16"): p for p in results["peak"] if p.get("gflops")}
        bf16 = any(r.get("cuvil_bf16_gflops") for r in results["gemm"])
        lines += ["## GEMM (`nn.Linear` without bias, M x K x N): GFLOP/s, median", "",
                  "| M x K x N | threads | Cuvil fp32 | of FMA peak | numpy | of FMA peak |"
                  + (" Cuvil bf16 | of bf16 peak |" if bf16 else ""),
                  "|---" * (8 if bf16 else 6) + "|"]

        def g(v, f="{:.1f}"):
            return f.format(v) if v is not None else "-"
        for r in results["gemm"]:
            lines.append(f"| {r['m']}x{r['k']}x{r['n']} | {r['threads']} | {g(r.get('cuvil_gflops'))} | "
                         f"{g(r.get('cuvil_efficiency'), '{:.0%}')} | {g(r.get('numpy_gflops'))} | "
                         f"{g(r.get('numpy_efficiency'), '{:.0%}')} |"
                         + (f" {g(r.get('cuvil_bf16_gflops'))} | {g(r.get('cuvil_bf16_efficiency'), '{:.0%}')} |"
                            if bf16 else ""))
        if peaks:
            lines += ["", "Measured peaks: " + ", ".join(
                f"{'bf16 dot product' if bf else 'FMA'} {p['gflops']:.1f} GFLOP/s at {t} thread(s)"
                for (t, bf), p in sorted(peaks.items()))]
        lines.append("")
    if results["cold_start"]:
        t = max(threads)
        lines += [f"## Cold start: a fresh process loads the artifact and runs once ({t} thread(s))", "",
                  "| model | system | start to result | peak RSS | artifact |", "|---|---|---|---|---|"]
        for r in results["cold_start"]:
            title = next((x.get("title") for x in results["latency"]
                          if x["model"] == r["model"] and x.get("title")), r["model"])
            if r.get("status") == "ok":
                rss = f"{r['peak_rss_mib']:.1f} MiB" if r.get("peak_rss_mib") is not None else "-"
                size = fmt_size(r["artifact_bytes"]) if r.get("artifact_bytes") else "-"
                lines.append(f"| {title} | {r['label']} | {r['cold_start_ms']:.1f} ms | {rss} | {size} |")
            else:
                lines.append(f"| {title} | {r['label']} | {r.get('status')}: {r.get('reason')} | - | - |")
        lines.append("")
    if results.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in results["notes"]] + [""]
    return "\n".join(lines)


def write_results(results: dict, path: Path, command: str) -> None:
    """results_markdown(...) to `path`, atomically (a temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(results_markdown(results, command))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results = {"format": "cuvil-compare-1", "machine": machine_info(),
               "settings": {"models": args.models, "systems": args.systems, "threads": args.threads,
                            "reps": args.reps, "cold_runs": args.cold_runs, "quick": args.quick,
                            "sample_s": args.sample_s,
                            "gemm_sample_s": args.gemm_sample_s, "gap_s": args.gap, "onnx_opset": bs.OPSET},
               "latency": [], "cold_start": [], "gemm": [], "peak": [], "gemm_info": {}}
    over = [t for t in args.threads if t > results["machine"]["affinity"]]
    if over:
        print(f"warning: {over} thread(s) asked for, {results['machine']['affinity']} CPUs available", flush=True)
    tools = {}
    bin_dir = args.out_dir / "bin"
    for name, source, extra in (("cuvil_run", "cuvil_run.c", ["-ldl"]), ("fma_peak", "fma_peak.c", []),
                                ("coldstart", "coldstart.c", [])):
        try:
            tools[name] = bench_gemm.build_c(source, bin_dir, extra)
        except Exception as exc:  # noqa: BLE001
            tools[f"{name}_error"] = bs.short(exc)
            print(f"warning: {source}: {exc}", flush=True)
    import torch
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    for key in args.models:
        run_model(key, args, tools, results)
    if not args.no_gemm:
        run_gemm(args, tools, results)
    results["machine"]["loadavg_end"] = os.getloadavg()
    print_report(results, args)
    chart_error = write_chart(results, args.out_dir / "compare.png")
    results["chart"] = chart_error or "compare.png"
    out_json = args.out_dir / "compare.json"
    tmp = out_json.with_name("compare.json.tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
    os.replace(tmp, out_json)
    print(f"\nwrote {out_json}" + (f" and {args.out_dir / 'compare.png'}" if not chart_error
                                   else f" (no chart: {chart_error})"))
    if args.results is not None:
        command = " ".join(["python benchmarks/compare.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
        write_results(results, args.results, command)
        print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
