"""qat_mode: PT2E-quantized PyTorch graphs (torchao's prepare_pt2e / prepare_qat_pt2e,
convert_pt2e, then torch.export) compile with the graph's own int8 scales and match
PyTorch's quantized reference (the converted module run by torch)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import cuvil
from cuvil.errors import CuvilError
from cuvil.options import Quantization

pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")


class SmallCNN(torch.nn.Module):
    """conv, depthwise conv (no int8 kernel: f32 weights), residual add, linear."""

    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.d = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.p = torch.nn.Conv2d(16, 16, 1)
        self.l1 = torch.nn.Linear(16 * 8 * 8, 32)
        self.l2 = torch.nn.Linear(32, 10)

    def forward(self, x):
        y = torch.relu(self.c(x))
        y = y + self.p(torch.relu(self.d(y)))
        return self.l2(torch.relu(self.l1(y.flatten(1))))


def _quantizer(kind: str, qat: bool = False):
    if kind == "x86":  # u8 asymmetric activations, i8 per-channel weights
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x
        q = x.X86InductorQuantizer()
        q.set_global(x.get_default_x86_inductor_quantization_config(is_qat=qat))
    else:  # arm: i8 asymmetric activations (-128..127, zero points)
        from torchao.quantization.pt2e.quantizer import arm_inductor_quantizer as a
        q = a.ArmInductorQuantizer()
        q.set_global(a.get_default_arm_inductor_quantization_config())
    return q


def _quantized(model, x, kind: str, qat: bool = False):
    torch.manual_seed(1)
    warnings.filterwarnings("ignore")
    if qat:
        from torchao.quantization.pt2e import move_exported_model_to_eval
        gm = torch.export.export(model.train(), (x,)).module()
        p = pt2e.prepare_qat_pt2e(gm, _quantizer(kind, qat=True))
        opt = torch.optim.SGD(p.parameters(), lr=0.01)
        for _ in range(4):  # a few steps of quantization-aware training
            loss = p(torch.randn_like(x)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        c = pt2e.convert_pt2e(p)
        move_exported_model_to_eval(c)
        return c
    gm = torch.export.export(model.eval(), (x,)).module()
    p = pt2e.prepare_pt2e(gm, _quantizer(kind))
    with torch.no_grad():
        for _ in range(8):
            p(torch.randn_like(x))
    return pt2e.convert_pt2e(p)


@pytest.mark.parametrize("kind,qat", [("x86", False), ("arm", False), ("x86", True)])
def test_pt2e_small_cnn_matches_torch_quantized_reference(kind, qat):
    torch.manual_seed(0)
    model = SmallCNN()
    x = torch.randn(2, 3, 8, 8)
    qm = _quantized(model, x, kind, qat)
    cm = cuvil.compile(qm, (x.numpy(),), quantization=Quantization("int8_sym", qat=True))
    report = cm.ir.main.attrs["quantization"]
    assert report["int8_ops"] == 4 and len(report["f32_weights"]) == 1  # the depthwise conv stays f32
    aqs = [op.attrs["act_quant"] for op in cm.ir.main.body.ops if "act_quant" in op.attrs]
    assert {a["dtype"] for a in aqs} == {"u8" if kind == "x86" else "i8"}
    step = min(a["scale"] for a in aqs)
    with torch.no_grad():
        for seed in range(3):
            xt = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
            ref = qm(xt).numpy()
            got = cm(xt.numpy())[0]
            err = np.abs(got - ref).max()
            # the same integers: far inside one quantization step of the finest activation grid
            assert err <= 1e-3 * step + 1e-6 * np.abs(ref).max(), (err, step)
            # and really quantized: the float model is much further away
            assert np.abs(model.eval()(xt).numpy() - ref).max() > 100 * err


def test_qat_mode_needs_quantize_nodes():
    model = SmallCNN().eval()
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with pytest.raises(CuvilError, match="no int8 quantize/dequantize nodes"):
        cuvil.compile(model, (x,), quantization=Quantization(qat=True))
    with pytest.raises(CuvilError, match="no calibration"):
        Quantization("int8_sym", qat=True, calibration=[(x,)])


def test_pt2e_graph_without_qat_mode_still_uses_its_scales():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    qm = _quantized(SmallCNN(), x, "x86")
    cm = cuvil.compile(qm, (x.numpy(),))
    assert cm.ir.main.attrs["quantization"]["int8_ops"] == 4
    with torch.no_grad():
        assert np.abs(cm(x.numpy())[0] - qm(x).numpy()).max() < 1e-5


def test_config_mapping_with_qat_mode(tmp_path):
    from cuvil.config import load_config
    from cuvil.quant_config import quantization_from_config
    base = ("model: {framework: pytorch, name: m, module: x, entry: y}\n"
            "inputs: [{name: x, shape: [1, 3], dtype: f32}]\nquantization:\n")
    mapping = ("  weight: {dtype: int8, scheme: symmetric, granularity: per_channel}\n"
               "  activation: {dtype: uint8, scheme: asymmetric, granularity: per_tensor}\n  qat_mode: true\n")
    (tmp_path / "a.yaml").write_text(base + mapping)
    assert quantization_from_config(load_config(tmp_path / "a.yaml")) == Quantization("int8_sym", qat=True,
                                                                                       activation="u8")
    (tmp_path / "b.yaml").write_text(base + mapping + "  calibration: {files: [a.npy]}\n")
    with pytest.raises(CuvilError, match="qat_mode"):
        quantization_from_config(load_config(tmp_path / "b.yaml"))
    (tmp_path / "c.yaml").write_text(base + "  method: fp16\n  qat_mode: true\n")
    with pytest.raises(CuvilError, match="does not combine"):
        quantization_from_config(load_config(tmp_path / "c.yaml"))


QAT_MODEL_PY = '''\
import torch
from tests.quant.test_qat import SmallCNN, _quantized


def cuvil_entry():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    return _quantized(SmallCNN(), x, "x86"), (x,)
'''
QAT_CONFIG = '''\
model: {framework: pytorch, name: qcnn, source: model.py, entry: cuvil_entry, python_path: [%s]}
inputs: [{name: x, shape: [2, 3, 8, 8], dtype: f32}]
outputs: [{name: y}]
quantization:
  weight: {dtype: int8, scheme: symmetric, granularity: per_channel}
  activation: {dtype: uint8, scheme: asymmetric, granularity: per_tensor}
  qat_mode: true
'''


def test_quant_report_lists_a_pre_quantized_graphs_scales(tmp_path):
    from pathlib import Path

    from cuvil.config import load_config
    from cuvil.quant_report import format_report, quant_report
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "model.py").write_text(QAT_MODEL_PY)
    (tmp_path / "config.yaml").write_text(QAT_CONFIG % root)
    report = quant_report(load_config(tmp_path / "config.yaml"), log=lambda s: None)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    cm = cuvil.compile(_quantized(SmallCNN(), x, "x86"), (x.numpy(),),
                       quantization=Quantization("int8_sym", qat=True))
    want = [op.attrs["act_quant"] for op in cm.ir.main.body.ops if "act_quant" in op.attrs]
    assert report["qat_mode"] and report["outputs"] == [] and "no fp32 model" in report["note"]
    assert [L["act_quant"] for L in report["layers"]] == want and len(want) == 4
    assert all(L["weight_scale"][0] > 0 and L["error"] is None for L in report["layers"])
    assert "qat_mode: scales from the model's graph" in format_report(report)
