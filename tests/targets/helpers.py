"""Helpers of the per-target tests: which targets this machine can build and run, a
tiny model project, and running built executables (natively, under qemu-aarch64 or
under Node's WASI) through the same `cuvil.native.run_command` as `cuvil run`."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cuvil.native import run_command

ROOT = Path(__file__).resolve().parents[2]
REL_TOL = 1e-4  # of max|ref|, as the core model tests

# target -> the programs needed to build and run its executables here
NEEDS = {
    "host": ("cc",),
    "aarch64-linux-gnu": ("aarch64-linux-gnu-gcc", "qemu-aarch64"),
    "wasm32-wasi": ("clang", "wasm-ld", "node"),
}


def available(target: str) -> bool:
    return all(shutil.which(p) for p in NEEDS[target])


def target_param(target: str):
    """A pytest param for `target` that skips (saying what is missing) when this machine
    cannot build or run it."""
    missing = [p for p in NEEDS[target] if not shutil.which(p)]
    return pytest.param(target, id=target, marks=pytest.mark.skipif(
        bool(missing), reason=f"{target}: {', '.join(missing)} not installed (make setup)"))


CROSS = [target_param("aarch64-linux-gnu"), target_param("wasm32-wasi")]
ALL = [target_param("host")] + CROSS

TINY_PY = '''\
import torch
from torch import nn


def cuvil_entry():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.GELU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10), nn.Softmax(-1))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    return model.eval(), (torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)
'''
TINY_YAML = '''\
model:
  framework: pytorch
  name: tiny
  source: model.py
  entry: cuvil_entry
inputs:
  - name: x
    shape: [1, 3, 16, 16]
    dtype: f32
outputs:
  - name: probs
'''


def tiny_project(path: Path, extra: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.py").write_text(TINY_PY)
    (path / "config.yaml").write_text(TINY_YAML + extra)
    return path / "config.yaml"


def build_project(tmp: Path, model_py: str, config_yaml: str, target: str, name: str) -> Path:
    """Write model.py and config.yaml under tmp/p and `cuvil build` them for `target`
    ("host" or a cross target) with a cache of their own; the executable's path."""
    from cuvil.build import build
    from cuvil.config import load_config
    project = tmp / "p"
    project.mkdir(parents=True, exist_ok=True)
    (project / "model.py").write_text(model_py)
    (project / "config.yaml").write_text(config_yaml)
    cfg = load_config(project / "config.yaml", target=None if target == "host" else target)
    return build(cfg, tmp / (f"{name}.wasm" if target == "wasm32-wasi" else name), cache_dir=tmp / "cache",
                 log=lambda s: None)


def run(exe: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(run_command(exe) + [str(a) for a in args], capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def run_npy(exe: Path, inputs: list[np.ndarray], tmp: Path, tag: str = "") -> np.ndarray:
    args = []
    for i, x in enumerate(inputs):
        np.save(tmp / f"in{tag}{i}.npy", x)
        args += ["--input", tmp / f"in{tag}{i}.npy"]
    out = tmp / f"out{tag}.npy"
    run(exe, *args, "--output", out)
    return np.load(out)


def assert_close(got: np.ndarray, ref: np.ndarray) -> float:
    """Same shape and dtype, max abs difference within REL_TOL x max|ref|; returns the
    relative error."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    err = float(np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))
    assert err <= REL_TOL, err
    return err


def disassemble(obj: Path, *options: str) -> str:
    """llvm-objdump -d (options such as --mattr=+dotprod decode extensions)."""
    tool = shutil.which("llvm-objdump") or shutil.which("llvm-objdump-14")
    if tool is None:
        pytest.skip("llvm-objdump not installed")
    return subprocess.run([tool, "-d", *options, str(obj)], capture_output=True, text=True, check=True).stdout
