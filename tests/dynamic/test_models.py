"""Whole models with symbolic dims: one BERT executable for every batch and sequence
length within its bounds, ResNet-50 and the unseen-family zoo with a symbolic batch, and
the real all-MiniLM-L6-v2 (Hugging Face BertModel) with both."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import cuvil
from tests.models_zoo import ZOO
from tests.targets.helpers import CROSS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from examples.models import randomize_norm_stats_, resnet  # noqa: E402
from examples.models.bert import BertConfig, dynamic_entry, example_inputs  # noqa: E402

BERT_TOL = 1e-4  # max |err| / max |ref|, the core tolerance


@pytest.fixture(scope="module")
def bert_exe(tmp_path_factory):
    out = tmp_path_factory.mktemp("bert") / "bert"
    proc = subprocess.run([sys.executable, "-m", "cuvil.cli", "build", "--config",
                           str(ROOT / "examples" / "bert_dynamic.yaml"), "--output", str(out),
                           "--cache-dir", str(out.parent / "cache")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def _run(exe, tmp, ids, mask, threads=2):
    np.save(tmp / "ids.npy", ids)
    np.save(tmp / "mask.npy", mask)
    return subprocess.run([str(exe), "--input", f"input_ids={tmp / 'ids.npy'}", "--input",
                           f"attention_mask={tmp / 'mask.npy'}", "--output", str(tmp / "out.npy"),
                           "--threads", str(threads)], capture_output=True, text=True)


@pytest.mark.parametrize("batch, seq", [(1, 8), (4, 8), (1, 64), (4, 64), (1, 384), (4, 384)])
def test_one_bert_executable_serves_every_batch_and_sequence_length(bert_exe, tmp_path, batch, seq):
    model, _ = dynamic_entry()
    ids, mask = example_inputs(seed=seq, batch=batch, seq=seq, cfg=BertConfig(max_positions=512))
    proc = _run(bert_exe, tmp_path, ids.numpy(), mask.numpy())
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "out.npy")
    with torch.no_grad():
        ref = model(ids, mask).numpy()
    assert got.shape == ref.shape == (batch, seq, 256)
    assert float(np.abs(got - ref).max()) <= BERT_TOL * float(np.abs(ref).max())


def test_bert_executable_refuses_shapes_outside_its_bounds(bert_exe, tmp_path):
    ids = np.ones((2, 513), np.int64)
    proc = _run(bert_exe, tmp_path, ids, ids)
    assert proc.returncode == 1 and not (tmp_path / "out.npy").exists()
    assert "dim 1 (seq_len) = 513 is outside its bounds [1, 512]" in proc.stderr
    proc = _run(bert_exe, tmp_path, np.ones((2, 5), np.int64), np.ones((3, 5), np.int64))
    assert proc.returncode == 1 and "input input_ids has batch = 2, but another input set batch = 3" in proc.stderr
    proc = _run(bert_exe, tmp_path, np.ones((2, 5, 1), np.int64), np.ones((2, 5), np.int64))
    assert proc.returncode == 1 and "has 3 dims, the model's has 2" in proc.stderr
    helptext = subprocess.run([str(bert_exe), "--help"], capture_output=True, text=True).stdout
    assert "seq_len" in helptext and "[1, 512]" in helptext and "[1, 8]" in helptext


def test_bert_header_and_manifest_describe_the_dims(bert_exe):
    cache = bert_exe.parent / "cache"
    header = next(cache.rglob("bert_dynamic.h")).read_text()
    assert '{"batch", 1, 8}' in header and '{"seq_len", 1, 512}' in header
    assert "bert_dynamic_set_input_shape" in header and "bert_dynamic_ctx_output_shape" in header
    assert "static const int32_t bert_dynamic_input_dim_symbols[4] = {0, 1, 0, 1};" in header
    import json
    manifest = json.loads(next(cache.rglob("bert_dynamic.json")).read_text())
    assert manifest["dims"] == [{"name": "batch", "min": 1, "max": 8}, {"name": "seq_len", "min": 1, "max": 512}]
    assert manifest["outputs"][0]["shape"] == ["batch", "seq_len", 256]
    inspect = subprocess.run([sys.executable, "-m", "cuvil.cli", "inspect", str(next(cache.rglob("*.cvir"))),
                              "--summary"], capture_output=True, text=True)
    assert "// symbolic dims: batch in [1, 8], seq_len in [1, 512]" in inspect.stdout
    assert "at the dims' upper bounds" in inspect.stdout


def test_resnet50_with_a_symbolic_batch_serves_1_and_8():
    torch.manual_seed(0)
    model = randomize_norm_stats_(resnet.resnet50()).eval()
    example = torch.randn(2, 3, 224, 224)
    cm = cuvil.compile(model, (example,), threads=2, dynamic_shapes=[("batch", 3, 224, 224)],
                       dim_bounds={"batch": (1, 8)})
    for batch in (1, 8):
        x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            ref = model(x).numpy()
        got = cm(x)[0]
        assert got.shape == (batch, 1000)
        assert float(np.abs(got - ref).max()) <= 1e-4 * float(np.abs(ref).max())
        assert (got.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_models_with_a_symbolic_batch(name):
    model, inputs = ZOO[name](0)
    shape = list(inputs[0].shape)
    example = torch.randn(2, *shape[1:], generator=torch.Generator().manual_seed(0))
    cm = cuvil.compile(model, (example,), dynamic_shapes=[["batch"] + shape[1:]], dim_bounds={"batch": (1, 6)},
                       jit=True)
    for batch in (1, 3, 6):
        x = torch.randn(batch, *shape[1:], generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            ref = model(x).numpy()
        got = cm(x)[0]
        assert float(np.abs(got - ref).max()) <= 1e-4 * max(float(np.abs(ref).max()), 1e-6), batch


def test_minilm_with_symbolic_batch_and_sequence_length():
    from tests.hf.minilm_model import SentenceEmbedding, load_sentence_transformer
    model = SentenceEmbedding(load_sentence_transformer()[0].auto_model).eval()
    gen = torch.Generator().manual_seed(0)
    example = (torch.randint(1000, 30000, (2, 16), generator=gen), torch.ones(2, 16, dtype=torch.int64))
    cm = cuvil.compile(model, example, threads=2, dynamic_shapes=[("batch", "seq_len")] * 2,
                       dim_bounds={"batch": (1, 16), "seq_len": (1, 256)})
    for batch, seq in [(1, 1), (1, 9), (4, 64), (3, 256)]:
        ids = torch.randint(1000, 30000, (batch, seq), generator=gen)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[0, seq // 2 + 1:] = 0
        with torch.no_grad():
            ref = model(ids, mask).numpy()
        got = cm(ids, mask)[0]
        cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
        assert got.shape == (batch, 384) and float(cos.min()) >= 0.9999, (batch, seq)
        assert float(np.abs(got - ref).max()) <= 1e-4


SMALL_BERT = f"""\
model:
  framework: pytorch
  name: bert_small
  module: examples.models.bert
  entry: dynamic_entry
  python_path: [{ROOT}]
inputs:
  - {{name: input_ids, shape: [batch, seq_len], dtype: i64}}
  - {{name: attention_mask, shape: [batch, seq_len], dtype: i64}}
dims: {{batch: [1, 3], seq_len: [1, 24]}}
"""


@pytest.mark.parametrize("target", CROSS)
def test_symbolic_dims_on_cross_targets(tmp_path, target):
    """The same symbolic-dim code for aarch64 (NEON, under qemu) and wasm32-wasi (SIMD128,
    under Node's WASI): one executable at several shapes, against torch."""
    (tmp_path / "c.yaml").write_text(SMALL_BERT)
    exe = tmp_path / ("bert.wasm" if target == "wasm32-wasi" else "bert")
    proc = subprocess.run([sys.executable, "-m", "cuvil.cli", "build", "--config", str(tmp_path / "c.yaml"),
                           "--output", str(exe), "--target", target], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    model, _ = dynamic_entry()
    for batch, seq in [(1, 5), (3, 24)]:
        ids, mask = example_inputs(seed=seq, batch=batch, seq=seq, cfg=BertConfig(max_positions=512))
        np.save(tmp_path / "ids.npy", ids.numpy())
        np.save(tmp_path / "mask.npy", mask.numpy())
        run = subprocess.run([sys.executable, "-m", "cuvil.cli", "run", str(exe), "--input",
                              f"input_ids={tmp_path / 'ids.npy'}", "--input", f"attention_mask={tmp_path / 'mask.npy'}",
                              "--output", str(tmp_path / "out.npy")], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        got = np.load(tmp_path / "out.npy")
        with torch.no_grad():
            ref = model(ids, mask).numpy()
        assert got.shape == ref.shape
        assert float(np.abs(got - ref).max()) <= BERT_TOL * float(np.abs(ref).max())
