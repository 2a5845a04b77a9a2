"""int8_sym from Bazel: `--//cuvil:quantization=int8_sym` (and the quantization
transition of cuvil_binary) compile with the cuvil_model's declared calibration
inputs; the executables agree with torch to int8 precision; without calibration inputs
the build fails with the compiler's message."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
import torch

from bazel_helpers import REPO, read_execution_log
from test_targets import QEMU, cat_image, run


def _mlp_reference(x: np.ndarray) -> np.ndarray:
    import sys
    sys.path.insert(0, str(REPO))
    from examples.models.mlp import cuvil_entry
    model, _ = cuvil_entry()
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def _run_npy(exe, x, tmp_path, prefix=()):
    np.save(tmp_path / "x.npy", x)
    run([*prefix, exe, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy"])
    return np.load(tmp_path / "y.npy")


def test_int8_flag_uses_the_declared_calibration_inputs(bazel, tmp_path):
    log = tmp_path / "int8.json"
    bazel.build("//tests/bazel:mlp_host", "--//cuvil:quantization=int8_sym", f"--execution_log_json_file={log}")
    (compile_,) = [s for s in read_execution_log(log) if s["mnemonic"] == "CuvilCompile"]
    argv = compile_["commandArgs"]
    cal = [argv[i + 1] for i, a in enumerate(argv) if a == "--calibration"]
    assert sorted(p.rsplit("/", 1)[-1] for p in cal) == [f"x{i}.npy" for i in range(8)], argv
    manifest = json.loads(bazel.bin("tests/bazel/mlp.json").read_text())
    q = manifest["quantization"]
    assert q["method"] == "int8_sym" and q["int8_ops"] == 3, q
    assert q["weight_bytes"] < 0.26 * q["weight_bytes_fp32"]
    x = np.random.default_rng(3).random((1, 784), dtype=np.float32)
    got = _run_npy(bazel.bin("tests/bazel/mlp_host"), x, tmp_path)
    ref = _mlp_reference(x)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert 1e-5 < err < 0.05, err  # int8, not f32, and close


def test_int8_transition_binary_matches_the_flag_build(bazel, tmp_path):
    bazel.build("//tests/bazel:mlp_int8", "//tests/bazel:mlp_host")
    x = np.random.default_rng(4).random((1, 784), dtype=np.float32)
    int8 = _run_npy(bazel.bin("tests/bazel/mlp_int8"), x, tmp_path)
    fp32 = _run_npy(bazel.bin("tests/bazel/mlp_host"), x, tmp_path)
    ref = _mlp_reference(x)
    np.testing.assert_allclose(fp32, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    err = np.abs(int8 - ref).max() / np.abs(ref).max()
    assert 1e-5 < err < 0.05, err


def test_int8_without_calibration_fails_with_the_compilers_message(bazel):
    proc = bazel.build("//tests/bazel:mlp_uncalibrated_host", "--//cuvil:quantization=int8_sym", check=False)
    assert proc.returncode != 0
    assert "quantization method 'int8_sym' needs calibration inputs" in proc.stderr, proc.stderr[-3000:]


def test_mobilenet_int8_on_the_host_and_aarch64(bazel, tmp_path):
    """MobileNetV2 (ImageNet weights) int8_sym calibrated on the shipped photos: the cat
    stays a cat, and aarch64 under qemu computes the same integers as the host."""
    if shutil.which(QEMU[0]) is None:
        pytest.fail("qemu-aarch64 is not installed: run `make setup` (qemu-user)")
    bazel.build("//examples/models:mobilenetv2_int8_host", "//examples/models:mobilenetv2_int8_aarch64")
    x = cat_image()
    host = _run_npy(bazel.bin("examples/models/mobilenetv2_int8_host"), x, tmp_path)
    a64 = _run_npy(bazel.bin("examples/models/mobilenetv2_int8_aarch64"), x, tmp_path, QEMU)
    assert int(host.argmax()) in (281, 282, 285), "tabby, tiger cat or Egyptian cat"
    np.testing.assert_allclose(a64, host, rtol=0, atol=1e-3 * np.abs(host).max())
    file_out = subprocess.run(["file", "-L", str(bazel.bin("examples/models/mobilenetv2_int8_aarch64"))],
                              capture_output=True, text=True).stdout
    assert "aarch64" in file_out, file_out


def test_bf16_flag_on_the_avx512_platform(bazel, tmp_path):
    """`--//cuvil:precision=bf16` with `--platforms=//platforms:linux_x86_64_avx512`: the
    manifest says bf16, the object multiplies with vdpbf16ps, and (on a CPU that has
    AVX512-BF16) the executable is close to torch but not f32-exact."""
    bazel.build("//tests/bazel:mlp_host", "--//cuvil:precision=bf16", "--platforms=//platforms:linux_x86_64_avx512")
    manifest = json.loads(bazel.bin("tests/bazel/mlp.json").read_text())
    assert manifest["precision"]["compute"] == "bf16" and manifest["precision"]["bf16_ops"] == 3, manifest
    exe = bazel.bin("tests/bazel/mlp_host")
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(exe)], capture_output=True, text=True,
                         check=True).stdout
    assert "vdpbf16ps" in asm and "zmm" in asm
    from cuvil.backend.llvm.target import host_target
    if not host_target().has_feature("avx512bf16"):
        return  # built and inspected; this CPU cannot run it
    x = np.random.default_rng(5).random((1, 784), dtype=np.float32)
    got = _run_npy(exe, x, tmp_path)
    ref = _mlp_reference(x)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert 1e-6 < err < 2e-2, err
