"""scaled_dot_product_attention against torch: causal with fewer queries than keys,
boolean and float masks, grouped-query heads (enable_gqa), and the refusal of
dropout_p > 0 (random in torch). In the interpreter and natively."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from cuvil.errors import UnsupportedOpError
from cuvil.frontends.torch import capture_torch
from tests.ops.checks import Fn, check_torch, seeded

TOL = dict(atol=1e-5, rtol=1e-4)
Q, K, V = seeded(1, 2, 4, 3, 8), seeded(2, 2, 4, 6, 8), seeded(3, 2, 4, 6, 8)


@pytest.mark.parametrize("kwargs", [dict(is_causal=True), dict(scale=0.3),
                                    dict(attn_mask=seeded(4, 3, 6) > 0), dict(attn_mask=seeded(5, 2, 1, 3, 6))])
def test_sdpa(kwargs):
    check_torch(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), Q, K, V, **TOL)


def test_grouped_query_heads():
    k, v = seeded(6, 2, 2, 6, 8), seeded(7, 2, 2, 6, 8)
    check_torch(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                Q, k, v, **TOL)


def test_dropout_is_refused():
    with pytest.raises(UnsupportedOpError, match="dropout_p"):
        capture_torch(Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)), (Q, K, V))
