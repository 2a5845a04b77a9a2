"""The libFuzzer harnesses (tests/fuzz/fuzz_*.c), built with clang's
-fsanitize=fuzzer,address,undefined (Debian's libclang-rt-14-dev), each run for
CUVIL_FUZZ_SECONDS from its seed corpus (tests/fuzz/corpus/<harness>/). A crash, a
sanitizer report, a leak or a harness check (a failure without a one-line message, a
non-finite pre-processed value, a wrong option lookup) fails the test and leaves the
input that caused it in the test's directory; the number of inputs run is printed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from cuvil.runtime import RUNTIME_DIR

from .conftest import HERE

SECONDS = int(os.environ.get("CUVIL_FUZZ_SECONDS", "45"))
RUNTIME = ["cuvil_runtime.c", "cuvil_threadpool.c", "cuvil_io.c", "cuvil_npy.c"]
HARNESSES = {
    "npy": (RUNTIME, []),
    "image": (RUNTIME + ["cuvil_image.c"], ["-Wl,-Bstatic", "-ljpeg", "-lpng16", "-lz", "-Wl,-Bdynamic"]),
    "plugin_options": (RUNTIME, []),
}


def build(name: str, out_dir) -> str:
    sources, libs = HARNESSES[name]
    clang = shutil.which("clang") or shutil.which("clang-14")
    assert clang, "clang is needed for libFuzzer (make setup installs it)"
    exe = out_dir / f"fuzz_{name}"
    cmd = [clang, "-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all",
           "-Wall", "-Wextra", "-Werror", "-I", str(RUNTIME_DIR), str(HERE / f"fuzz_{name}.c"),
           *(str(RUNTIME_DIR / s) for s in sources), "-o", str(exe), *libs, "-lm", "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-3000:]}\n(libFuzzer's runtime: apt-get install " \
                              "libclang-rt-14-dev; make fuzz-packages)"
    return str(exe)


@pytest.mark.parametrize("name", HARNESSES)
def test_fuzz_harness(name, tmp_path):
    exe = build(name, tmp_path)
    work = tmp_path / "corpus"  # new inputs go here; the committed seeds stay as they are
    work.mkdir()
    seeds = HERE / "corpus" / name
    assert len(list(seeds.iterdir())) >= 3
    r = subprocess.run([exe, f"-max_total_time={SECONDS}", "-seed=1", "-timeout=10", "-rss_limit_mb=2048",
                        "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", str(work), str(seeds)],
                       capture_output=True, text=True, timeout=SECONDS + 300,
                       env={**os.environ, "ASAN_OPTIONS": "detect_leaks=1"})
    runs = re.search(r"stat::number_of_executed_units: (\d+)", r.stderr)
    findings = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "leak-", "timeout-", "oom-"))]
    assert r.returncode == 0 and not findings, f"{findings}\n{r.stderr[-4000:]}"
    assert runs and int(runs.group(1)) > 1000, r.stderr[-2000:]
    print(f"\nfuzz_{name}: {int(runs.group(1)):,} inputs in {SECONDS} s, 0 findings "
          f"(corpus {len(list(seeds.iterdir()))} seeds -> {len(list(work.iterdir()))} new)")


def test_seeds_pass_the_harnesses(tmp_path):
    """Every committed seed runs clean (-runs=0: the corpus only, no mutation)."""
    for name in HARNESSES:
        exe = build(name, tmp_path)
        r = subprocess.run([exe, "-runs=0", str(HERE / "corpus" / name)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
