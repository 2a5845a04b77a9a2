"""cuvil_parallel_for from C: coverage of [0, n) on 1, 2 and 4 threads, chunk counts, the
1-thread and nested (serial) paths, two callers at once, thread-local counts, idle workers
sleeping rather than spinning."""
from __future__ import annotations

from pathlib import Path

from cuvil.runtime import RUNTIME_DIR

from .helpers import compile_c, run_c

C_DIR = Path(__file__).parent / "c"


def test_parallel_for_from_c(tmp_path):
    exe = compile_c([C_DIR / "threadpool_test.c", RUNTIME_DIR / "cuvil_threadpool.c",
                     RUNTIME_DIR / "cuvil_runtime.c"], tmp_path / "threadpool_test")
    proc = run_c(exe)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
