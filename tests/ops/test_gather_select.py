"""Embedding, where / masked_fill (with broadcasting and scalar branches) and dropout,
which must be the identity in eval mode and refused in training mode."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes
from torch import nn
from torch.nn import functional as F

from cuvil.errors import UnsupportedOpError
from cuvil.frontends.torch import capture_torch
from tests.ops.checks import check_torch, op_names, seeded

EXACT = dict(atol=0, rtol=0)


def indices(seed, high, *shape):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def embedding(n, d, **kw) -> nn.Embedding:
    torch.manual_seed(0)
    return nn.Embedding(n, d, **kw)


@pytest.mark.parametrize("module, idx", [
    (embedding(10, 4), indices(1, 10, 7)),
    (embedding(10, 4), indices(2, 10, 2, 5)),
    (embedding(10, 4, padding_idx=0), torch.tensor([[0, 3, 0, 9]])),
    (embedding(3, 2), torch.tensor([2, 2, 0, 1, 0])),
])
def test_embedding(module, idx):
    check_torch(module, idx, **EXACT)


def test_embedding_functional_and_index_select():
    w = seeded(1, 6, 3)
    check_torch(lambda i: F.embedding(i, w), indices(2, 6, 4), **EXACT)
    check_torch(lambda x, i: torch.index_select(x, 1, i), seeded(3, 2, 6, 3), indices(4, 6, 5), **EXACT)


@given(mutually_broadcastable_shapes(num_shapes=3, max_dims=3, min_side=1, max_side=4), st.integers(0, 2 ** 16))
def test_where_broadcasting(shapes, seed):
    c, a, b = shapes.input_shapes
    check_torch(torch.where, seeded(seed, *c) > 0, seeded(seed + 1, *a), seeded(seed + 2, *b), **EXACT)


@pytest.mark.parametrize("fn", [
    lambda x: torch.where(x > 0, x, 0.0), lambda x: torch.where(x > 0, -1.0, x),
    lambda x: torch.where(x < 0.5, 2.0, 3.0) * x,
    lambda x: x.masked_fill(x > 0.3, -1e4), lambda x: x.masked_fill(x.abs() < 0.5, float("-inf")),
    lambda x: torch.where(torch.logical_not(x > 0), x, x * 2),
])
def test_where_scalar_branches(fn):
    check_torch(fn, seeded(5, 3, 6), **EXACT)


def test_where_on_integers():
    a, b = indices(1, 50, 3, 4), indices(2, 50, 4)
    check_torch(lambda a, b: torch.where(a > b, a, b), a, b, **EXACT)


@pytest.mark.parametrize("module", [
    nn.Dropout(0.5), nn.Dropout(0.9), nn.Dropout2d(0.5), nn.AlphaDropout(0.3),
    lambda x: F.dropout(x, 0.5, training=False),
])
def test_dropout_in_eval_is_identity(module):
    x = seeded(6, 2, 3, 4, 4)
    ir = check_torch(module, x, **EXACT)
    assert op_names(ir) == []  # nothing computed: the output is the input


class DropoutInForward(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5, training=True) * 2


def test_dropout_in_training_mode_is_refused():
    """Identity would silently differ from torch, which drops at random."""
    with pytest.raises(UnsupportedOpError, match="dropout"):
        capture_torch(DropoutInForward(), (seeded(7, 2, 3),))
