"""softmax and log_softmax against torch over every dim, incl. large logits."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from tests.ops.checks import check_torch, seeded

ATOL, RTOL = 1e-6, 1e-5
LOG_ATOL = 1e-5  # log_softmax values are O(log n) and larger for spread logits


@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.data())
def test_softmax_dims(shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    x = seeded(len(shape) + dim, *shape) * 3
    check_torch(lambda x: F.softmax(x, dim), x, atol=ATOL, rtol=RTOL, name=f"softmax dim={dim}")
    check_torch(lambda x: F.log_softmax(x, dim), x, atol=LOG_ATOL, rtol=RTOL, name=f"log_softmax dim={dim}")


@pytest.mark.parametrize("fn", [
    lambda x: torch.softmax(x, -1), lambda x: x.softmax(1), nn.Softmax(dim=0), nn.LogSoftmax(dim=-1),
    lambda x: torch.log_softmax(x, 1),
])
def test_softmax_forms(fn):
    check_torch(fn, seeded(1, 3, 7), atol=LOG_ATOL, rtol=RTOL)


def test_softmax_large_logits_are_stable():
    x = seeded(2, 4, 16) * 100 + 500  # exp() of these overflows float32 without max-subtraction
    check_torch(lambda x: (F.softmax(x, -1), F.log_softmax(x, -1)), x, atol=1e-4, rtol=RTOL)


@pytest.mark.parametrize("shape", [(3, 37), (2, 4, 128), (5, 203), (7, 48), (3, 5, 256), (1, 32)])
def test_softmax_long_rows(shape):
    """Rows of at least two vectors take the vector max (lanes folded, then the tail);
    rows of whole vectors, up to 16 of them, stay in registers two at a time (an odd row
    count leaves one for last).
    The maxima are large enough that exp() overflows unless they are found: in the last
    element (the tail where n % 16 != 0), at column 17 of every other row, and masked
    (-inf) entries are ignored."""
    x = seeded(3, *shape) * 4
    x[..., -1] += 200
    x.view(-1, shape[-1])[::2, 17] += 300
    x.view(-1, shape[-1])[1::3, :9] = float("-inf")
    check_torch(lambda x: (F.softmax(x, -1), F.log_softmax(x, -1)), x, atol=LOG_ATOL, rtol=RTOL)


@pytest.mark.parametrize("shape", [(5, 3, 64), (2, 12, 8, 128)])
def test_softmax_rows_in_registers(shape):
    """Rows of whole vectors held in registers, two at a time: every row's own maximum
    and sum (logits spread so that rows differ), an odd row count in the first shape."""
    x = seeded(4, *shape) * 3 + torch.arange(shape[-1]) * 0.05
    check_torch(lambda x: F.softmax(x, -1), x, atol=ATOL, rtol=RTOL)
