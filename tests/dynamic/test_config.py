"""The config's `dims` and `specialize` sections: validated with key and file:line."""
from __future__ import annotations

from pathlib import Path

import pytest

from cuvil.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
BASE = f"""\
model:
  framework: pytorch
  module: examples.models.bert
  entry: dynamic_entry
  python_path: [{ROOT}]
inputs:
  - {{name: input_ids, shape: [batch, seq_len], dtype: i64}}
  - {{name: attention_mask, shape: [batch, seq_len], dtype: i64}}
"""


def _load(tmp_path, extra):
    p = tmp_path / "c.yaml"
    p.write_text(BASE + extra)
    return load_config(p)


def test_dims_and_specialisations_load(tmp_path):
    cfg = _load(tmp_path, "dims: {batch: [1, 8], seq_len: [1, 512]}\nspecialize:\n  - {batch: 1, seq_len: 128}\n")
    assert cfg.data["dims"] == {"batch": [1, 8], "seq_len": [1, 512]}


@pytest.mark.parametrize("extra, message", [
    ("dims: {batch: [1, 8]}\n", r"inputs\[0\]\.shape\[1\].*'seq_len' is not declared under 'dims'"),
    ("dims: {batch: [1, 8], seq_len: [1, 512], other: [1, 2]}\n", r"dims\.other.*not used by any input"),
    ("dims: {batch: [8, 1], seq_len: [1, 512]}\n", r"dims\.batch.*min 8 is larger than max 1"),
    ("dims: {batch: [0, 8], seq_len: [1, 512]}\n", r"dims\.batch"),
    ("dims: {batch: [1, 8], seq_len: [1, 512]}\nspecialize: [{seq_len: 600}]\n",
     r"specialize\[0\]\.seq_len.*600 is outside the bounds"),
    ("dims: {batch: [1, 8], seq_len: [1, 512]}\nspecialize: [{heads: 2}]\n", r"specialize\[0\]\.heads.*not one of the dims"),
])
def test_bad_dims_name_the_key_and_line(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message) as err:
        _load(tmp_path, extra)
    assert "c.yaml:" in str(err.value)
