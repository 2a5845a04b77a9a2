"""Cuvil in someone else's repository: a workspace of its own, made from the README's
snippets (tests/bazel/monorepo.py), loads Cuvil with `local_repository` +
cuvil_dependencies() / cuvil_register_toolchains() and imports cuvil.bazelrc.

In order, on one Bazel server with a disk cache: the README's build command (C++ app
and `//models:resnet50_aarch64`, `--@cuvil//cuvil:quantization=fp16`) and its outputs
against torch, on the host and under qemu; switching the quantization re-runs only the
model's actions, and switching back is served from the cache; after `bazel clean`
every action is a cache hit; an action's error names the workspace-relative file; a
config without inputs and an interpreter without the compiler's packages each stop the
build with one line saying what to do. About 5 minutes (ResNet-50 compiled 4 times).
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bazel_helpers import Bazel, cache_hit, read_execution_log
from monorepo import CLASSES, SIDE, make_monorepo
from test_targets import EM_AARCH64, EM_X86_64, QEMU, elf_machine, run

README_BUILD = ["//models:app", "//models:resnet50_aarch64"]
FP16 = "--@cuvil//cuvil:quantization=fp16"
NONE = "--@cuvil//cuvil:quantization=none"
# fp16 weights move the logits by about 2^-11 of their scale per layer (tests/models/test_fp16.py).
FP16_REL_TOL = 5e-3


@pytest.fixture(scope="module")
def mono(tmp_path_factory):
    """(bazel, workspace, disk cache): one server for the whole module, shut down after."""
    if shutil.which(QEMU[0]) is None:
        pytest.fail("qemu-aarch64 is not installed: run `make setup` (qemu-user)")
    root = make_monorepo(tmp_path_factory.mktemp("monorepo"))
    b = Bazel(tmp_path_factory.mktemp("bazel-output-base-monorepo"), workspace=root)
    yield b, root, tmp_path_factory.mktemp("disk-cache")
    b.shutdown()


def _build(mono, log: Path | None, *args, check=True):
    bazel, _, disk = mono
    extra = [f"--execution_log_json_file={log}"] if log else []
    return bazel.build(f"--disk_cache={disk}", *extra, *args, check=check)


def _describe(spawns) -> str:
    return "\n".join(f"{s['mnemonic']} ({s.get('runner')}): {' '.join(s['commandArgs'][-3:])}" for s in spawns)


def _torch_logits(root: Path, x: np.ndarray) -> np.ndarray:
    spec = importlib.util.spec_from_file_location("monorepo_resnet50", root / "models" / "resnet50.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, _ = module.cuvil_entry()
    with torch.no_grad():
        return model.eval()(torch.from_numpy(x)).numpy()


def _close(got: np.ndarray, ref: np.ndarray, rel: float, what: str):
    assert got.shape == ref.shape, what
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err <= rel, f"{what}: max error {err:.2e} of the logits' scale (allowed {rel:.0e})"
    return err


@pytest.fixture(scope="module")
def first_build(mono, tmp_path_factory):
    """The README's command, with an empty disk cache: its execution log."""
    log = tmp_path_factory.mktemp("logs") / "first.json"
    _build(mono, log, *README_BUILD, FP16)
    return read_execution_log(log)


def test_readme_example_builds_and_matches_torch(mono, first_build, tmp_path):
    bazel, root, _ = mono
    assert sorted(s["mnemonic"] for s in first_build if s["mnemonic"].startswith("Cuvil")) == \
        ["CuvilCapture", "CuvilCompile", "CuvilCompile"], "one capture, a compile per platform"
    for s in first_build:
        if s["mnemonic"] == "CuvilCompile":
            argv = s["commandArgs"]
            assert argv[argv.index("--quantization") + 1] == "fp16", argv

    app, a64 = bazel.bin("models/app"), bazel.bin("models/resnet50_aarch64")
    assert elf_machine(app) == EM_X86_64 and elf_machine(a64) == EM_AARCH64
    # The cross build's directory says which platform it is for.
    assert "linux_aarch64" in os.path.realpath(a64).split("/bin/")[0], os.path.realpath(a64)

    x = np.random.default_rng(7).standard_normal((1, 3, SIDE, SIDE), np.float32)
    x.tofile(tmp_path / "x.f32")
    run([app, tmp_path / "x.f32", tmp_path / "app.f32"])
    from_app = np.fromfile(tmp_path / "app.f32", np.float32).reshape(1, CLASSES)
    np.save(tmp_path / "x.npy", x)
    run([*QEMU, a64, "--input", tmp_path / "x.npy", "--output", tmp_path / "a64.npy"])
    from_a64 = np.load(tmp_path / "a64.npy")

    ref = _torch_logits(root, x)
    err = _close(from_app, ref, FP16_REL_TOL, "C++ app (fp16) vs torch")
    assert err > 1e-6, "fp16 weights, not f32"
    _close(from_a64, from_app, 1e-4, "aarch64 under qemu vs the host app")


def _runtime_actions(spawns):
    """Actions that make files of Cuvil's own packages (the C runtime's objects and
    archives, under bin/external/cuvil/)."""
    return [s for s in spawns if any("/bin/external/cuvil/" in o["path"] for o in s.get("actualOutputs", []))]


def test_switching_quantization_rebuilds_only_the_model(mono, first_build, tmp_path):
    bazel = mono[0]
    to_none, back = tmp_path / "none.json", tmp_path / "back.json"
    _build(mono, to_none, *README_BUILD, NONE)
    spawns = read_execution_log(to_none)
    mnemonics = sorted(s["mnemonic"] for s in spawns)
    assert "CuvilCapture" not in mnemonics, mnemonics
    assert mnemonics.count("CuvilCompile") == 2, _describe(spawns)
    assert not _runtime_actions(spawns), "the C runtime was rebuilt:\n" + _describe(_runtime_actions(spawns))
    # What runs: the two compiles, the model's glue (a C compile per library) and links.
    assert set(mnemonics) <= {"CuvilCompile", "CppCompile", "CppLink", "CppArchive", "Symlink"}, mnemonics
    assert len(spawns) <= 10, _describe(spawns)
    # Both quantizations keep their files, side by side.
    for q in ("fp16", "none"):
        assert bazel.bin(f"models/resnet50.{q}-f32/resnet50.o").is_file(), q

    _build(mono, back, *README_BUILD, FP16)
    spawns = read_execution_log(back)
    missed = [s for s in spawns if not cache_hit(s)]
    assert not missed, "switching back ran actions again:\n" + _describe(missed)


def test_comment_edit_reruns_only_the_capture(mono, first_build, tmp_path):
    """The compile action reads the captured bundle, not the model's source: a comment
    in resnet50.py re-runs the capture, whose output is the same, and nothing else."""
    _, root, _ = mono
    source = root / "models" / "resnet50.py"
    text = source.read_text()
    log = tmp_path / "comment.json"
    try:
        source.write_text(text + "\n# a comment\n")
        _build(mono, log, *README_BUILD, FP16)
    finally:
        source.write_text(text)
    spawns = read_execution_log(log)
    assert [s["mnemonic"] for s in spawns if not cache_hit(s)] == ["CuvilCapture"], _describe(spawns)


def test_clean_rebuild_is_all_cache_hits(mono, first_build, tmp_path):
    bazel = mono[0]
    log = tmp_path / "clean.json"
    bazel("clean")
    _build(mono, log, *README_BUILD, FP16)
    spawns = read_execution_log(log)
    assert {"CuvilCapture", "CuvilCompile", "CppCompile", "CppLink"} <= {s["mnemonic"] for s in spawns}
    missed = [s for s in spawns if not cache_hit(s)]
    assert not missed, "not served by the disk cache after bazel clean:\n" + _describe(missed)


def test_unsupported_op_error_names_the_workspace_file(mono):
    proc = _build(mono, None, "//errs:unsup", check=False)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("cuvil: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    # The workspace-relative path: not the sandbox's, nor the source tree's behind it.
    assert re.search(r"unsupported op monorepo\.mystery.* at errs/unsup\.py:8 in forward: return mystery\(y\)", errors[0]), errors


def test_config_without_inputs_is_an_error(mono):
    proc = _build(mono, None, "//errs:noinputs", check=False)
    assert proc.returncode != 0
    assert "errs/noinputs.yaml:1: model: the config has no 'inputs'" in proc.stderr, proc.stderr[-3000:]


def test_interpreter_without_the_packages_says_what_to_set(mono, tmp_path):
    """Last: it re-makes @cuvil_python (the module's other builds are done)."""
    bare = tmp_path / "python"  # an interpreter that runs but has no torch, numpy, ...
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S -I \"$@\"\n")
    bare.chmod(0o755)
    proc = _build(mono, None, "--nobuild", "//models:app", f"--repo_env=CUVIL_PYTHON={bare}", check=False)
    assert proc.returncode != 0
    assert f"cuvil: CUVIL_PYTHON={bare} lacks numpy, llvmlite, yaml, torch: install Cuvil's requirements.lock into it" \
        in proc.stderr, proc.stderr[-3000:]
