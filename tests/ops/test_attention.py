"""scaled_dot_product_attention against torch: masks (bool, additive, broadcast),
is_causal, explicit scale, cross-attention lengths, and hypothesis over shapes."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn import functional as F

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
