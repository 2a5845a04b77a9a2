"""`cuvil quant-report`: the per-layer scales and errors are checked against values
computed here from torch (forward hooks on the calibration inputs), the output figures
against the int8 model `cuvil.compile` builds with the same calibration. Also `cuvil
compile --calibration` (the files the Bazel rule passes)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cuvil
from cuvil.cli import main
from cuvil.options import Quantization

MODEL_PY = '''\
import torch
from torch import nn


def net():
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 12, 3, stride=2, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(12 * 6 * 6, 7)).eval()


def cuvil_entry():
    return net(), (torch.zeros(2, 3, 12, 12),)
'''
CONFIG = '''\
model: {framework: pytorch, name: small, source: model.py, entry: cuvil_entry}
inputs: [{name: x, shape: [2, 3, 12, 12], dtype: f32}]
outputs: [{name: scores}]
quantization:
  method: %s
  keep_f32: %d
  calibration:
    files: [calib/*.npy]
'''


def _project(tmp_path: Path, method: str = "int8_sym", keep: int = 0) -> Path:
    (tmp_path / "calib").mkdir(exist_ok=True)
    rng = np.random.default_rng(5)
    for i in range(5):
        np.save(tmp_path / "calib" / f"c{i}.npy", (rng.standard_normal((2, 3, 12, 12)) * (1 + i)).astype(np.float32))
    (tmp_path / "model.py").write_text(MODEL_PY)
    (tmp_path / "config.yaml").write_text(CONFIG % (method, keep))
    return tmp_path / "config.yaml"


def _model(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("quant_report_model", tmp_path / "model.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m.net()


def _report(tmp_path, *extra) -> dict:
    rc = main(["quant-report", "--config", str(tmp_path / "config.yaml"), "--json", str(tmp_path / "r.json"), *extra])
    assert rc == 0
    return json.loads((tmp_path / "r.json").read_text())


def _fq(x, scale, zp):
    return (torch.clamp(torch.round(x / scale) + zp, 0, 255) - zp) * scale


def test_layer_scales_and_errors_match_torch(tmp_path, capsys):
    _project(tmp_path)
    r = _report(tmp_path)
    printed = capsys.readouterr().out
    model = _model(tmp_path)
    layers = [model[0], model[2], model[5]]
    calib = [torch.from_numpy(np.load(tmp_path / "calib" / f"c{i}.npy")) for i in range(5)]
    seen = {i: [] for i in range(3)}
    hooks = [m.register_forward_hook(lambda mod, inp, out, i=i: seen[i].append((inp[0].clone(), out.clone())))
             for i, m in enumerate(layers)]
    with torch.no_grad():
        for x in calib:
            model(x)
    for h in hooks:
        h.remove()
    assert r["method"] == "int8_sym" and r["calibration_inputs"] == 5 and len(r["layers"]) == 3
    for i, (layer, m) in enumerate(zip(r["layers"], layers)):
        assert layer["op"] == ("cuvil.matmul" if i == 2 else "cuvil.conv2d") and layer["int8"]
        w = m.weight.detach()
        ws = w.reshape(len(w), -1).abs().max(1).values / 127
        np.testing.assert_allclose(layer["weight_scale"], [ws.min(), ws.max()], rtol=1e-6)
        lo = min(0.0, min(float(x.min()) for x, _ in seen[i]))
        hi = max(0.0, max(float(x.max()) for x, _ in seen[i]))
        scale = (hi - lo) / 255
        aq = layer["act_quant"]
        assert aq["dtype"] == "u8" and aq["zero_point"] == round(-lo / scale)
        np.testing.assert_allclose(aq["scale"], scale, rtol=1e-6)
        wq = torch.clamp(torch.round(w / ws.reshape(-1, *[1] * (w.dim() - 1))), -127, 127) * ws.reshape(
            -1, *[1] * (w.dim() - 1))
        num = den = 0.0
        for x, ref in seen[i]:
            xq = _fq(x, aq["scale"], aq["zero_point"])
            b = m.bias.detach()
            got = F.linear(xq, wq, b) if i == 2 else F.conv2d(xq, wq, b, m.stride, m.padding)
            num += float(((got - ref).double() ** 2).sum())
            den += float((ref.double() ** 2).sum())
        np.testing.assert_allclose(layer["error"], np.sqrt(num / den), rtol=2e-2)
        assert 1e-4 < layer["error"] < 0.1
    assert "weight_name" in r["layers"][0] and f"{r['layers'][1]['act_quant']['scale']:.4g}" in printed

    q = Quantization("int8_sym", calibration=[(x.numpy(),) for x in calib])
    cm = cuvil.compile(model, (calib[0],), quantization=q, jit=True)
    got = np.concatenate([cm(x.numpy())[0] for x in calib]).astype(np.float64)
    with torch.no_grad():
        ref = np.concatenate([model(x).numpy() for x in calib]).astype(np.float64)
    (o,) = r["outputs"]
    assert o["output"] == "scores" and o["samples"] == 10
    np.testing.assert_allclose(o["rel_l2"], np.linalg.norm(got - ref) / np.linalg.norm(ref), rtol=1e-3)
    np.testing.assert_allclose(o["max_abs"], np.abs(got - ref).max(), rtol=1e-3)
    assert o["top1_agreement"] == (got.argmax(1) == ref.argmax(1)).mean()
    assert r["weight_bytes"] < 0.3 * r["weight_bytes_fp32"]


def test_kept_layers_and_input_limit(tmp_path):
    _project(tmp_path, keep=1)
    r = _report(tmp_path, "--inputs", "2")
    assert [L["int8"] for L in r["layers"]].count(False) == 1
    assert r["calibration_inputs"] == 2 and r["outputs"][0]["samples"] == 4


def test_other_methods_report_outputs(tmp_path):
    _project(tmp_path, method="fp16")
    r = _report(tmp_path)
    assert r["layers"] == [] and 0 < r["outputs"][0]["rel_l2"] < 1e-3
    assert r["weight_bytes"] == pytest.approx(r["weight_bytes_fp32"] / 2, rel=0.01)


@pytest.mark.parametrize("args, message", [
    (["--quantization", "int8_sym", "--inputs", "0"], "--inputs 0"),
    ([], "no quantization"),
])
def test_errors(tmp_path, capsys, args, message):
    _project(tmp_path, method="none")
    assert main(["quant-report", "--config", str(tmp_path / "config.yaml"), *args]) == 1
    assert message in capsys.readouterr().err


def test_compile_takes_calibration_files_from_the_command_line(tmp_path, capsys):
    """`cuvil compile --calibration F ...` (what the Bazel rule passes) on a config with
    no calibration section: int8_sym from those files; other files are refused."""
    _project(tmp_path, method="none")
    text = (tmp_path / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text(text.split("quantization:")[0])  # no calibration section
    cfg = str(tmp_path / "config.yaml")
    assert main(["capture", "--config", cfg, "--output", str(tmp_path / "m.cvir")]) == 0
    files = [str(tmp_path / "calib" / f"c{i}.npy") for i in range(3)]
    argv = ["compile", str(tmp_path / "m.cvir"), "--config", cfg, "--quantization", "int8_sym"]
    assert main(argv + ["--output-dir", str(tmp_path / "none")]) == 1
    assert "needs calibration inputs" in capsys.readouterr().err
    args = [a for f in files for a in ("--calibration", f)]
    assert main(argv + ["--output-dir", str(tmp_path / "out"), *args]) == 0
    q = json.loads((tmp_path / "out" / "small.json").read_text())["quantization"]
    assert q["method"] == "int8_sym" and q["int8_ops"] == 3
    (tmp_path / "notes.txt").write_text("x")
    assert main(argv + ["--output-dir", str(tmp_path / "bad"), "--calibration", str(tmp_path / "notes.txt")]) == 1
    assert "calibration files are .npy, .npz or images" in capsys.readouterr().err
