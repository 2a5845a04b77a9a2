"""Every Cuvil stage is a cacheable node: a clean rebuild comes entirely from the disk
cache, outputs are byte-identical when re-executed, and changing only the
quantization re-runs compile (and link) but never capture."""
from __future__ import annotations

import hashlib
from pathlib import Path

from bazel_helpers import cache_hit, read_execution_log

# The small model, for the host (x86_64) and for aarch64 (platform transition): one
# capture, two compiles, C compiles and links for both.
TARGETS = ["//tests/bazel:mlp_host", "//tests/bazel:mlp_aarch64"]


def _cuvil_mnemonics(spawns):
    return sorted(s["mnemonic"] for s in spawns if s["mnemonic"].startswith("Cuvil"))


def _digests(bazel, names):
    return {n: hashlib.sha256(bazel.bin(n).read_bytes()).hexdigest() for n in names}


def test_clean_rebuild_is_all_disk_cache_hits(fresh_bazel, tmp_path):
    disk = tmp_path / "disk-cache"
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    fresh_bazel.build(*TARGETS, f"--disk_cache={disk}", f"--execution_log_json_file={first}")
    spawns = read_execution_log(first)
    # The capture ran once for both platforms; one compile per platform.
    assert _cuvil_mnemonics(spawns) == ["CuvilCapture", "CuvilCompile", "CuvilCompile"]
    assert not any(cache_hit(s) for s in spawns), "the disk cache was empty"

    fresh_bazel("clean")
    fresh_bazel.build(*TARGETS, f"--disk_cache={disk}", f"--execution_log_json_file={second}")
    spawns = read_execution_log(second)
    assert _cuvil_mnemonics(spawns) == ["CuvilCapture", "CuvilCompile", "CuvilCompile"]
    missed = [f"{s['mnemonic']}: {s.get('runner')} {' '.join(s['commandArgs'][:6])}"
              for s in spawns if not cache_hit(s)]
    assert not missed, "not served by the disk cache after bazel clean:\n" + "\n".join(missed)
    assert {s["mnemonic"] for s in spawns} >= {"CuvilCapture", "CuvilCompile", "CppCompile", "CppLink"}


def test_reexecuted_stages_give_identical_bytes(fresh_bazel):
    outputs = [f"tests/bazel/mlp.none-f32/mlp{ext}" for ext in (".o", ".weights.o", ".h", ".json", "_app.c")]
    fresh_bazel.build("//tests/bazel:mlp_host")
    before = _digests(fresh_bazel, outputs)
    output_path = Path(fresh_bazel("info", "output_path").stdout.strip())
    cvirs = list(output_path.glob("*/bin/tests/bazel/mlp_capture.cvir"))
    assert len(cvirs) == 1, cvirs  # one capture configuration
    cvir = cvirs[0]
    cvir_before = hashlib.sha256(cvir.read_bytes()).hexdigest()
    fresh_bazel("clean")
    fresh_bazel.build("//tests/bazel:mlp_host")  # no cache: every action runs again
    assert _digests(fresh_bazel, outputs) == before
    assert hashlib.sha256(cvir.read_bytes()).hexdigest() == cvir_before


def test_quantization_change_reruns_compile_not_capture(fresh_bazel, tmp_path):
    log = tmp_path / "quantization.json"
    fresh_bazel.build("//tests/bazel:mlp_host")  # quantization none (the default)
    proc = fresh_bazel.build("//tests/bazel:mlp_host", "--//cuvil:quantization=fp16", "--keep_going",
                             f"--execution_log_json_file={log}", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spawns = read_execution_log(log)
    mnemonics = [s["mnemonic"] for s in spawns]
    assert "CuvilCapture" not in mnemonics, mnemonics
    compiles = [s for s in spawns if s["mnemonic"] == "CuvilCompile"]
    assert len(compiles) == 1, mnemonics
    argv = compiles[0]["commandArgs"]
    assert argv[argv.index("--quantization") + 1] == "fp16"
    assert "CppLink" in mnemonics, "a new object must be linked again"
