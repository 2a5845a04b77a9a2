"""ONNX models with symbolic dims: the model's dim_params, bounded by dim_bounds (or the
config's `dims`), stay symbolic; Shape -> Gather -> Concat -> Reshape chains are evaluated
at capture time with the symbols. Exported from torch with dynamic axes, checked against
torch and onnxruntime at several sizes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import cuvil
from cuvil.errors import CuvilError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from examples.models.bert import BertConfig, bert_encoder, example_inputs  # noqa: E402

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _export(model, inputs, dims, path):
    prog = torch.onnx.export(model, inputs, dynamo=True, dynamic_shapes=dims, verbose=False)
    prog.save(str(path))
    return onnx.load(str(path))


def _ort(path, feeds):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), feeds)})


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory):
    torch.manual_seed(0)
    cfg = BertConfig(max_positions=512, layers=2)
    model = bert_encoder(cfg).eval()
    batch, seq = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("seq", min=1, max=512)
    path = tmp_path_factory.mktemp("onnx") / "bert.onnx"
    proto = _export(model, example_inputs(batch=2, seq=16, cfg=cfg), ({0: batch, 1: seq}, {0: batch, 1: seq}), path)
    return model, cfg, path, proto


def test_onnx_bert_with_symbolic_batch_and_sequence(bert_onnx):
    model, cfg, path, proto = bert_onnx
    params = [[d.dim_param for d in i.type.tensor_type.shape.dim] for i in proto.graph.input]
    assert params == [["batch", "seq"], ["batch", "seq"]]
    ids, mask = example_inputs(batch=2, seq=16, cfg=cfg)
    cm = cuvil.compile(proto, (ids.numpy(), mask.numpy()), dim_bounds={"batch": (1, 16), "seq": (1, 512)})
    assert cm.symbols == ["batch", "seq"]
    for b, s in [(1, 1), (1, 8), (3, 40), (4, 384)]:
        ids, mask = example_inputs(seed=s, batch=b, seq=s, cfg=cfg)
        got = cm(ids.numpy(), mask.numpy())[0]
        with torch.no_grad():
            ref = model(ids, mask).numpy()
        peer = _ort(path, [ids.numpy(), mask.numpy()])[0]
        assert got.shape == ref.shape == peer.shape == (b, s, 256)
        scale = float(np.abs(ref).max())
        assert float(np.abs(got - ref).max()) <= 1e-4 * scale
        assert float(np.abs(got - peer).max()) <= 1e-4 * scale


def test_onnx_cnn_with_a_symbolic_batch_from_a_config(tmp_path):
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 16, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(16, 5)).eval()
    path = tmp_path / "cnn.onnx"
    _export(cnn, (torch.randn(2, 3, 32, 32),), ({0: torch.export.Dim("n", min=1, max=8)},), path)
    (tmp_path / "c.yaml").write_text(f"""\
model:
  framework: onnx
  name: cnn
  onnx: {path}
inputs:
  - {{name: image, shape: [n, 3, 32, 32], dtype: f32}}
dims:
  n: [1, 8]
""")
    exe = tmp_path / "cnn"
    proc = subprocess.run([sys.executable, "-m", "cuvil.cli", "build", "--config", str(tmp_path / "c.yaml"),
                           "--output", str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for n in (1, 3, 8):
        x = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(n))
        np.save(tmp_path / "x.npy", x.numpy())
        run = subprocess.run([str(exe), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        with torch.no_grad():
            np.testing.assert_allclose(np.load(tmp_path / "y.npy"), cnn(x).numpy(), rtol=1e-4, atol=1e-5)


def test_onnx_dim_bounds_must_name_dim_params(bert_onnx):
    _, cfg, _, proto = bert_onnx
    ids, mask = example_inputs(batch=2, seq=16, cfg=cfg)
    with pytest.raises(CuvilError, match="'seq_len', but no input of the model declares such a dim_param"):
        cuvil.compile(proto, (ids.numpy(), mask.numpy()), dim_bounds={"batch": (1, 4), "seq_len": (1, 64)})
