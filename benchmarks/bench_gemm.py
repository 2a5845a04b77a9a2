"""GEMM throughput for `compare.py`: Cuvil vs numpy vs the measured FMA peak.

- Cuvil: `cuvil.compile` of an `nn.Linear(K, N, bias=False)` on an [M, K] input, run
  through the C API (pointer arrays built once).
- numpy: `np.matmul(a, b, out=c)` in a worker process started with OPENBLAS_CORETYPE and
  OPENBLAS_L2_SIZE removed from its environment (so OpenBLAS picks its kernel for this
  CPU itself) and OPENBLAS_NUM_THREADS / OMP_NUM_THREADS set to the thread count; the
  worker answers one timing request per line, so its samples interleave with Cuvil's.
- peak: `fma_peak.c`, independent AVX-512 (or AVX2) FMA chains on N threads.
Also the small C helpers' build (cached by source hash under the results directory).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent


def build_c(source: str, out_dir: Path, extra: list[str]) -> Path:
    """Compile benchmarks/<source> with gcc -O2 into out_dir (cached by content)."""
    src = BENCH_DIR / source
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc/cc) found")
    flags = ["-O2", "-std=gnu11", "-pthread"]
    digest = hashlib.sha256(src.read_bytes() + " ".join([cc, *flags, *extra]).encode()).hexdigest()[:12]
    exe = out_dir / f"{src.stem}-{digest}"
    if not exe.is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_name(exe.name + ".tmp")
        proc = subprocess.run([cc, *flags, str(src), "-o", str(tmp), *extra], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} {source} failed: {proc.stderr.strip()[-400:]}")
        os.replace(tmp, exe)
    return exe


def fma_peak(exe: Path, threads: int, seconds: float, bf16: bool = False) -> tuple[float, str]:
    """One peak sample: (GFLOP/s, isa); bf16: the vdpbf16ps peak (CalledProcessError with
    exit status 3 where the CPU has no AVX512-BF16)."""
    out = subprocess.run([str(exe), str(threads), str(seconds)] + (["bf16"] if bf16 else []),
                         capture_output=True, text=True, check=True)
    gflops, isa = out.stdout.split()
    return float(gflops), isa


WORKER = r"""
import ctypes, sys, time
import numpy as np

def corename():
    for line in open("/proc/self/maps"):
        if "openblas" in line.lower() and ".so" in line:
            path = line.split()[-1]
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for sym in ("openblas_get_corename", "scipy_openblas_get_corename64_", "openblas_get_corename64_"):
                fn = getattr(lib, sym, None)
                if fn is not None:
                    fn.restype = ctypes.c_char_p
                    return fn().decode()
    return "unknown"

np.matmul(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))
print("ready", corename(), flush=True)
rng = np.random.default_rng(0)
cache = {}
for line in sys.stdin:
    m, k, n, inner = map(int, line.split())
    if (m, k, n) not in cache:
        cache[(m, k, n)] = (rng.standard_normal((m, k), dtype=np.float32),
                            rng.standard_normal((k, n), dtype=np.float32), np.empty((m, n), np.float32))
    a, b, c = cache[(m, k, n)]
    np.matmul(a, b, out=c)
    t0 = time.perf_counter()
    for _ in range(inner):
        np.matmul(a, b, out=c)
    print((time.perf_counter() - t0) / inner, flush=True)
"""


class NumpyWorker:
    """A numpy process at `threads` BLAS threads answering timing requests."""

    def __init__(self, threads: int):
        env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        env.update(OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ready = self.proc.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise RuntimeError("numpy worker did not start")
        self.core = ready[1]

    def time(self, m: int, k: int, n: int, inner: int) -> float:
        """Seconds per matmul, the mean of `inner` back-to-back calls."""
        self.proc.stdin.write(f"{m} {k} {n} {inner}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class CuvilGemm:
    """y = x @ W^T for x [M, K], W [N, K]: an nn.Linear without bias compiled by Cuvil."""

    def __init__(self, m: int, k: int, n: int, precision: str = "f32"):
        import torch

        import cuvil
        from cuvil.options import Quantization
        gen = torch.Generator().manual_seed(0)
        linear = torch.nn.Linear(k, n, bias=False).eval()
        with torch.no_grad():
            linear.weight.copy_(torch.randn(n, k, generator=gen))
        x = torch.randn(m, k, generator=gen)
        self.model = cuvil.compile(linear, (x,), threads=1, quantization=Quantization(precision=precision))
        self.x = np.ascontiguousarray(x.numpy())
        self.y = np.empty((m, n), np.float32)
        self._in = (ctypes.c_void_p * 1)(self.x.ctypes.data)
        self._out = (ctypes.c_void_p * 1)(self.y.ctypes.data)
        self.fast = hasattr(self.model, "_invoke")
        self.call()
        ref = self.x.astype(np.float64) @ linear.weight.detach().numpy().astype(np.float64).T
        self.max_rel_err = float(np.abs(self.y - ref).max() / max(np.abs(ref).max(), 1e-30))

    def set_threads(self, threads: int) -> None:
        self.model.set_threads(threads)

    def call(self) -> None:
        if self.fast:
            self.model._invoke(self._in, self._out)
        else:
            self.y = self.model(self.x)[0]
