"""scaled_dot_product_attention against torch: masks (bool, additive, broadcast),
is_causal, explicit scale, cross-attention lengths, and hypothesis over shapes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn import functional as F

import cuvil
from tests.ops.checks import check_torch, seeded

ATOL, RTOL = 1e-5, 1e-4

sdpa = F.scaled_dot_product_attention
B, H, S, D = 2, 3, 5, 8
Q, K, V = seeded(1, B, H, S, D), seeded(2, B, H, S, D), seeded(3, B, H, S, D)


def keep_mask(seed, *shape):
    m = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.4
    m[..., 0] = True  # no fully masked rows (torch returns NaN or 0 for them, depending on backend)
    return m


@pytest.mark.parametrize("fn, extra", [
    (lambda q, k, v: sdpa(q, k, v), []),
    (lambda q, k, v: sdpa(q, k, v, is_causal=True), []),
    (lambda q, k, v: sdpa(q, k, v, scale=0.3), []),
    (lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), [keep_mask(4, B, H, S, S)]),
    (lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), [keep_mask(5, S, S)]),              # broadcast mask
    (lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), [seeded(6, B, 1, 1, S)]),           # additive, BERT-style
    (lambda q, k, v, m: sdpa(q, k, v, attn_mask=m, scale=2.0), [seeded(7, B, H, S, S)]),
])
def test_sdpa(fn, extra):
    check_torch(fn, Q, K, V, *extra, atol=ATOL, rtol=RTOL)


def test_sdpa_cross_attention_and_3d():
    q, k, v = seeded(8, 2, 3, 4), seeded(9, 2, 6, 4), seeded(10, 2, 6, 5)   # Sq=3, Sk=6, Dv=5
    check_torch(lambda q, k, v: sdpa(q, k, v), q, k, v, atol=ATOL, rtol=RTOL)
    check_torch(lambda q, k, v: sdpa(q, k, v, is_causal=True), q, k, v, atol=ATOL, rtol=RTOL)


@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 6), st.integers(1, 6), st.integers(1, 8),
       st.booleans(), st.integers(0, 2 ** 16))
def test_sdpa_shapes(b, h, sq, sk, d, causal, seed):
    q, k, v = seeded(seed, b, h, sq, d), seeded(seed + 1, b, h, sk, d), seeded(seed + 2, b, h, sk, d)
    check_torch(lambda q, k, v: sdpa(q, k, v, is_causal=causal), q, k, v, atol=ATOL, rtol=RTOL)


# -- the fused kernel (passes/fuse_attention.py, kernels.k_attention) -------------------------

def _op_names(fn, *inputs, threads=1):
    compiled = cuvil.compile(_Module(fn), inputs, threads=threads)
    return [op.name for op in compiled.ir.main.body.ops], compiled


class _Module(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _scaled_masked(q, k, v, mask):
    return torch.softmax(q @ k.transpose(-1, -2) * 0.17 + mask, -1) @ v


@pytest.fixture
def fuse_any_size(monkeypatch):
    """Fuse attention whatever the size of its score matrix."""
    from cuvil.passes import fuse_attention
    monkeypatch.setattr(fuse_attention, "MIN_SCORE_BYTES", 0)


@pytest.mark.parametrize("b, h, s, sk, d, dv", [
    (1, 12, 128, 128, 32, 32),   # BERT-shaped: whole row blocks, rows in registers
    (2, 3, 37, 45, 8, 5),        # a short last block; scores rows with a 13-lane tail; Dv < a vector
    (1, 2, 20, 700, 16, 24),     # long keys: fewer rows a block, softmax rows past the registers
    (1, 1, 1, 3, 4, 4),          # one query row, fewer keys than a vector
])
def test_attention_runs_fused_without_the_score_matrix(fuse_any_size, b, h, s, sk, d, dv):
    q, k, v = seeded(11, b, h, s, d), seeded(12, b, h, sk, d), seeded(13, b, h, sk, dv)
    mask = seeded(14, b, 1, 1, sk) * 2
    check_torch(_scaled_masked, q, k, v, mask, atol=ATOL, rtol=RTOL)
    names, one = _op_names(_scaled_masked, q, k, v, mask)
    assert "cuvil.attention" in names and "cuvil.softmax" not in names
    _, two = _op_names(_scaled_masked, q, k, v, mask, threads=2)
    arrays = [x.numpy() for x in (q, k, v, mask)]
    np.testing.assert_array_equal(one(*arrays)[0], two(*arrays)[0])


def test_long_sequences_fuse_by_default_and_short_ones_do_not():
    """The default threshold (fuse_attention.MIN_SCORE_BYTES): 2 heads of 512 x 512
    scores (2 MiB) fuse, 12 heads of 128 x 128 (768 KiB) stay three ops."""
    q, k, v, mask = seeded(18, 1, 2, 512, 16), seeded(19, 1, 2, 512, 16), seeded(20, 1, 2, 512, 16), \
        seeded(21, 1, 1, 1, 512)
    check_torch(_scaled_masked, q, k, v, mask, atol=ATOL, rtol=RTOL)
    assert "cuvil.attention" in _op_names(_scaled_masked, q, k, v, mask)[0]
    q, k, v, mask = (seeded(22, 1, 12, 128, 8), seeded(23, 1, 12, 128, 8), seeded(24, 1, 12, 128, 8),
                     seeded(25, 1, 1, 1, 128))
    assert "cuvil.attention" not in _op_names(_scaled_masked, q, k, v, mask)[0]


def test_attention_is_not_fused_where_the_scores_or_probabilities_are_used_again(fuse_any_size):
    q, k, v = seeded(15, 1, 2, 9, 8), seeded(16, 1, 2, 11, 8), seeded(17, 1, 2, 11, 8)

    def probs_too(q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2), -1)
        return p @ v, p

    def scores_twice(q, k, v):
        s = q @ k.transpose(-1, -2)
        return torch.softmax(s, -1) @ v + s.sum(-1, keepdim=True)

    def broadcast_kv(q, k, v):  # one key/value head for all query heads
        return torch.softmax(q @ k[:, :1].transpose(-1, -2), -1) @ v[:, :1]

    for fn in (probs_too, scores_twice, broadcast_kv):
        check_torch(fn, q, k, v, atol=ATOL, rtol=RTOL)
        names, _ = _op_names(fn, q, k, v)
        assert "cuvil.attention" not in names and "cuvil.softmax" in names, fn.__name__


@pytest.mark.parametrize("vector_bits", [128, 256, 512])
def test_fused_attention_and_head_transposes_at_every_vector_width(fuse_any_size, vector_bits):
    """The fused kernel and the vector transposes (rows, and blocks of the width's lanes)
    against the interpreter on the same IR with 4-, 8- and 16-lane vectors."""
    from cuvil.api import _to_ir
    from cuvil.ir import interpreter
    from cuvil.passes import run_pipeline
    from tests.quant.helpers import run_native

    def heads(q, k, v, m):  # [1, S, 3 * 16] -> heads, attention, back
        q, k, v = (x.view(1, x.shape[1], 2, 16).transpose(1, 2) for x in (q, k, v))
        out = torch.softmax(q @ k.transpose(-1, -2) * 0.3 + m, -1) @ v
        return out.transpose(1, 2).reshape(1, -1, 32), k.transpose(-1, -2) * 1.0
    xs = (seeded(26, 1, 37, 32), seeded(27, 1, 48, 32), seeded(28, 1, 48, 32), seeded(29, 1, 1, 1, 48))
    module = run_pipeline(_to_ir(_Module(heads), xs))
    names = [op.name for op in module.main.body.ops]
    assert "cuvil.attention" in names and names.count("cuvil.transpose") >= 3
    arrays = [x.numpy() for x in xs]
    for got, ref in zip(run_native(module, arrays, vector_bits), interpreter.run(module, arrays)):
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)
