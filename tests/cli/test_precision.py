"""`precision: bf16` from the config and the command line: the executable computes its
conv/linear in bfloat16 (close to torch, not equal to the fp32 build), the build log and
manifest say so, compile outputs stay byte-identical, and a combination with a
quantization method is one config error naming the key."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cuvil.backend.llvm.target import host_target
from cuvil.build import build
from cuvil.cli import main
from cuvil.config import load_config
from cuvil.errors import CuvilError
from tests.cli.test_build import project, run_exe

BF16_REL_TOL = 2e-2  # as tests/quant/test_bf16.py


def _bf16_project(path):
    cfg = project(path)
    cfg.write_text(cfg.read_text() + "precision: bf16\n")
    return cfg


def _reference(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("test_precision_tiny_model", path / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m, (x,) = mod.cuvil_entry()
    with torch.no_grad():
        return x.numpy(), m(x).numpy()


def test_bf16_build_from_the_config(tmp_path):
    cfg = _bf16_project(tmp_path / "p")
    logs = []
    exe = build(load_config(cfg), tmp_path / "tiny_bf16", cache_dir=tmp_path / "c", log=logs.append)
    x, ref = _reference(tmp_path / "p")
    got = run_exe(exe, [x], tmp_path)
    fp32 = run_exe(build(load_config(project(tmp_path / "q")), tmp_path / "tiny", cache_dir=tmp_path / "c2",
                         log=lambda s: None), [x], tmp_path)
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= BF16_REL_TOL * scale
    assert np.abs(got - fp32).max() > 1e-6 * scale          # really bf16
    assert any(line.startswith("[compile] precision bf16: 2 conv2d/matmul ops") for line in logs), logs
    manifest = json.loads(next((tmp_path / "c").rglob("tiny.json")).read_text())
    native = host_target().has_feature("avx512bf16")  # the config's target is the host
    assert manifest["precision"] == {"compute": "bf16", "bf16_ops": 2, "kernel": "dpbf16ps" if native else "bf16"}
    # without the instructions, the log says so (and how the bf16 products run there)
    assert any("no AVX-512-BF16" in line for line in logs) == (not native), logs


def test_compile_precision_flag_matches_the_config_and_is_deterministic(tmp_path):
    cfg = project(tmp_path / "p")
    cvir = tmp_path / "m.cvir"
    assert main(["capture", "--config", str(cfg), "--output", str(cvir)]) == 0
    outs = []
    for d in ("a", "b"):
        assert main(["compile", str(cvir), "--config", str(cfg), "--output-dir", str(tmp_path / d),
                     "--precision", "bf16"]) == 0
        outs.append({p.name: p.read_bytes() for p in (tmp_path / d).iterdir()})
    assert outs[0] == outs[1]
    assert json.loads(outs[0]["tiny.json"])["precision"]["compute"] == "bf16"
    cfg_bf16 = _bf16_project(tmp_path / "q")
    assert main(["compile", str(cvir), "--config", str(cfg_bf16), "--output-dir", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "tiny.o").read_bytes() == outs[0]["tiny.o"]


def test_bf16_with_a_quantization_method_is_a_config_error(tmp_path):
    cfg = _bf16_project(tmp_path / "p")
    cfg.write_text(cfg.read_text() + "quantization: {method: fp16}\n")
    with pytest.raises(CuvilError, match=r"config.yaml:\d+: precision: precision bf16 .* does not combine "
                                         r"with quantization method 'fp16'"):
        load_config(cfg)
    cfg.write_text(cfg.read_text().replace("precision: bf16", "precision: bf17"))
    with pytest.raises(CuvilError, match="precision"):
        load_config(cfg)
