"""Batch norm (inference, with non-trivial running statistics) and layer norm against torch."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from examples.models import randomize_norm_stats_
from tests.ops.checks import check_torch, seeded

ATOL, RTOL = 1e-5, 1e-5


def bn(cls, n, seed=0, **kw) -> nn.Module:
    return randomize_norm_stats_(cls(n, **kw), seed)


@pytest.mark.parametrize("module, shape", [
    (bn(nn.BatchNorm2d, 4), (2, 4, 5, 6)),
    (bn(nn.BatchNorm2d, 4, eps=1e-1), (1, 4, 3, 3)),          # eps matters
    (bn(nn.BatchNorm2d, 3, affine=False), (1, 3, 4, 4)),
    (bn(nn.BatchNorm1d, 5), (3, 5)),
    (bn(nn.BatchNorm1d, 5), (2, 5, 7)),
])
def test_batch_norm(module, shape):
    check_torch(module, seeded(1, *shape), atol=ATOL, rtol=RTOL)


def test_batch_norm_functional_without_affine():
    mean, var = seeded(2, 3), seeded(3, 3, low=0.5, high=2.0)
    check_torch(lambda x: F.batch_norm(x, mean, var, eps=1e-3), seeded(4, 2, 3, 4, 4), atol=ATOL, rtol=RTOL)


def test_batch_norm_module_in_train_mode_is_captured_in_inference_form():
    """capture_torch puts the model in eval mode: running stats, not batch stats."""
    module = bn(nn.BatchNorm2d, 3).train()
    x = seeded(5, 4, 3, 2, 2)
    check_torch(module, x, atol=ATOL, rtol=RTOL)  # check_torch compares with eval()-mode torch
    with torch.no_grad():
        batch_stats = nn.BatchNorm2d(3).train()(x)
    assert not torch.allclose(module(x), batch_stats, atol=1e-3)


def layer_norm(shape, seed=0, **kw) -> nn.LayerNorm:
    torch.manual_seed(seed)
    m = nn.LayerNorm(shape, **kw)
    with torch.no_grad():  # non-trivial affine parameters
        if m.weight is not None:
            m.weight.uniform_(0.5, 1.5)
        if m.bias is not None:
            m.bias.uniform_(-0.5, 0.5)
    return m


@pytest.mark.parametrize("module, shape", [
    (layer_norm(8), (3, 8)),
    (layer_norm(8), (2, 5, 8)),
    (layer_norm((5, 8)), (2, 5, 8)),                       # two normalised dims
    (layer_norm(8, elementwise_affine=False), (4, 8)),
    (layer_norm(8, bias=False), (4, 8)),                    # weight only
    (layer_norm(8, eps=0.5), (4, 8)),                       # eps matters
    (layer_norm(1), (4, 1)),                                # a single element: output is the bias
])
def test_layer_norm(module, shape):
    check_torch(module, seeded(1, *shape) * 3 + 1, atol=ATOL, rtol=RTOL)


def test_layer_norm_functional_bias_only():
    b = seeded(2, 6)
    check_torch(lambda x: F.layer_norm(x, (6,), None, b), seeded(3, 2, 6), atol=ATOL, rtol=RTOL)


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_layer_norm_shapes(shape, data):
    k = data.draw(st.integers(1, len(shape)), label="normalised dims")
    module = layer_norm(tuple(shape[len(shape) - k:]), seed=k)
    check_torch(module, seeded(sum(shape), *shape), atol=ATOL, rtol=RTOL)
