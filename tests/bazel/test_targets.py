"""Cross builds: the executables and libraries Bazel makes for aarch64 Linux and
wasm32-wasi run (under qemu-aarch64 and node's WASI) and agree with the host's (the
aarch64 ones on .npy inputs and on examples/cat.jpg);
the C++ app over two models agrees with the models' own executables."""
from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bazel_helpers import REPO

QEMU = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
EM_X86_64, EM_AARCH64 = 62, 183


def elf_machine(path: Path) -> int:
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and head[4] == 2, f"{path} is not a 64-bit ELF file"
    return struct.unpack_from("<H", head, 18)[0]


def run(cmd, timeout=900) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc.stdout


def assert_logits_close(host: np.ndarray, other: np.ndarray, what: str):
    """Same shape and top-5; values within 1e-4 of the logits' scale."""
    assert host.shape == other.shape and host.dtype == other.dtype == np.float32, what
    scale = float(np.abs(host).max())
    np.testing.assert_allclose(other, host, rtol=1e-4, atol=1e-4 * scale, err_msg=what)
    assert list(np.argsort(-host.ravel())[:5]) == list(np.argsort(-other.ravel())[:5]), what


def cat_image() -> np.ndarray:
    """examples/cat.jpg pre-processed like the example configs: shorter side 256,
    centre crop 224, ImageNet mean/std, NCHW."""
    from PIL import Image
    img = Image.open(REPO / "examples" / "cat.jpg").convert("RGB")
    w, h = img.size
    s = 256 / min(w, h)
    img = img.resize((max(224, round(w * s)), max(224, round(h * s))), Image.BILINEAR)
    left, top = (img.size[0] - 224) // 2, (img.size[1] - 224) // 2
    x = np.asarray(img.crop((left, top, left + 224, top + 224)), dtype=np.float32) / 255.0
    x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


@pytest.mark.parametrize("model, image", [
    ("resnet50", "random"),      # the example: random weights (seed 0)
    ("mobilenetv2", "cat"),      # pretrained weights: a photo must stay a cat
])
def test_aarch64_executable_matches_host(bazel, tmp_path, model, image):
    if shutil.which(QEMU[0]) is None:
        pytest.fail("qemu-aarch64 is not installed: run `make setup` (qemu-user)")
    bazel.build(f"//examples/models:{model}_aarch64", f"//examples/models:{model}_host")
    host, a64 = bazel.bin(f"examples/models/{model}_host"), bazel.bin(f"examples/models/{model}_aarch64")
    assert elf_machine(host) == EM_X86_64
    assert elf_machine(a64) == EM_AARCH64

    x = cat_image() if image == "cat" else np.random.default_rng(1).standard_normal((1, 3, 224, 224), np.float32)
    np.save(tmp_path / "x.npy", x)
    run([host, "--input", tmp_path / "x.npy", "--output", tmp_path / "host.npy"])
    run([*QEMU, a64, "--input", tmp_path / "x.npy", "--output", tmp_path / "aarch64.npy"])
    host_out, a64_out = np.load(tmp_path / "host.npy"), np.load(tmp_path / "aarch64.npy")
    assert host_out.shape == (1, 1000)
    assert_logits_close(host_out, a64_out, f"{model}: aarch64 (qemu) vs host")
    if image == "cat":
        assert int(host_out.argmax()) in (281, 282, 285), "tabby, tiger cat or Egyptian cat"
    # The photo itself, decoded and pre-processed by the executables (aarch64: Debian's
    # arm64 libjpeg-turbo, linked statically as the host's).
    photo = REPO / "examples" / "cat.jpg"
    run([host, "--input", photo, "--output", tmp_path / "host_photo.npy"])
    run([*QEMU, a64, "--input", photo, "--output", tmp_path / "aarch64_photo.npy"])
    host_photo = np.load(tmp_path / "host_photo.npy")
    assert_logits_close(host_photo, np.load(tmp_path / "aarch64_photo.npy"), f"{model}: cat.jpg, aarch64 vs host")
    if image == "cat":
        assert int(host_photo.argmax()) in (281, 282, 285), "tabby, tiger cat or Egyptian cat"


def test_wasm32_program_matches_host(bazel):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node (with node:wasi) is not installed: no WASI runtime to run wasm32 on")
    bazel.build("//tests/bazel:mlp_api", "//tests/bazel:mlp_api_wasm32")
    wasm = bazel.bin("tests/bazel/mlp_api_wasm32")
    assert wasm.read_bytes()[:4] == b"\0asm"
    host = np.array(run([bazel.bin("tests/bazel/mlp_api")]).split(), dtype=np.float32)
    out = np.array(run([node, "--no-warnings", REPO / "tests/bazel/run_wasi.mjs", wasm]).split(), dtype=np.float32)
    assert host.shape == out.shape == (10,)
    np.testing.assert_allclose(out, host, rtol=1e-5, atol=1e-6)


def test_wasm32_executable_matches_host(bazel, tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node (with node:wasi) is not installed: no WASI runtime to run wasm32 on")
    bazel.build("//tests/bazel:mlp_host", "//tests/bazel:mlp_wasm32")
    assert bazel.bin("tests/bazel/mlp_wasm32").read_bytes()[:4] == b"\0asm"
    np.save(tmp_path / "x.npy", np.random.default_rng(2).standard_normal((1, 784), np.float32))
    run([bazel.bin("tests/bazel/mlp_host"), "--input", tmp_path / "x.npy", "--output", tmp_path / "host.npy"])
    # The module sees the current directory (run_wasi.mjs preopens "."): relative paths.
    subprocess.run([node, "--no-warnings", REPO / "tests/bazel/run_wasi.mjs", bazel.bin("tests/bazel/mlp_wasm32"),
                    "--input", "x.npy", "--output", "wasm.npy"], cwd=tmp_path, check=True, timeout=300)
    host, out = np.load(tmp_path / "host.npy"), np.load(tmp_path / "wasm.npy")
    assert host.shape == out.shape == (1, 10)
    np.testing.assert_allclose(out, host, rtol=1e-5, atol=1e-6)


def synthetic_image() -> np.ndarray:
    """The image examples/cpp_app/main.cc makes (same formula, float32)."""
    c, y, x = np.meshgrid(np.arange(3), np.arange(224), np.arange(224), indexing="ij")
    f = np.float32
    v = np.sin(f(0.05) * (x * (c + 1)).astype(f) + f(0.03) * y.astype(f)) + \
        np.cos(f(0.02) * (x + y).astype(f) - c.astype(f))
    return v.astype(np.float32)[None]


def test_cpp_app_matches_model_executables(bazel, tmp_path):
    bazel.build("//examples/cpp_app", "//examples/models:resnet50_host", "//examples/models:mobilenetv2_host")
    stdout = run([bazel.bin("examples/cpp_app/cpp_app"), tmp_path])
    assert "resnet50 top-5:" in stdout and "mobilenet_v2 top-5:" in stdout
    np.save(tmp_path / "x.npy", synthetic_image())
    for target, prefix in (("resnet50_host", "resnet50"), ("mobilenetv2_host", "mobilenet_v2")):
        run([bazel.bin(f"examples/models/{target}"), "--input", tmp_path / "x.npy",
             "--output", tmp_path / f"{prefix}.npy"])
        expected = np.load(tmp_path / f"{prefix}.npy")
        got = np.fromfile(tmp_path / f"{prefix}.f32", dtype=np.float32).reshape(expected.shape)
        assert_logits_close(expected, got, f"{prefix}: C++ app vs {target}")


def test_runtime_libraries_match_the_link_stage(bazel):
    """//:runtime and //:runtime_main compile the sources the link stage (cuvil.native)
    compiles, so Bazel-built artifacts and `cuvil link` ones have the same runtime."""
    import sys
    sys.path.insert(0, str(REPO / "compiler"))
    from cuvil.runtime import CORE_SOURCES, EXE_SOURCES

    def srcs(label):
        out = bazel("query", f"labels(srcs, {label})").stdout.split()
        return sorted(s.rsplit("/", 1)[-1] for s in out if s.endswith(".c"))

    assert srcs("//:runtime") == sorted(CORE_SOURCES)
    assert srcs("//:runtime_main") == sorted(EXE_SOURCES)
