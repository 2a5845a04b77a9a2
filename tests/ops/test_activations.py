"""Activations against torch on inputs that cross every kink and saturation point."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.ops.checks import check_torch, seeded

ATOL, RTOL = 1e-6, 1e-5

# [-8, 8) plus the exact kinks of relu/relu6/hardtanh/hardswish/hardsigmoid.
X = torch.cat([seeded(1, 4, 30, low=-8.0, high=8.0).flatten(),
               torch.tensor([-6.0, -3.0, -1.0, 0.0, 1.0, 3.0, 6.0, -0.0])]).reshape(2, 4, 16)


@pytest.mark.parametrize("fn", [
    F.relu, F.relu6, F.hardtanh, F.silu, F.sigmoid, F.tanh, F.hardswish, F.hardsigmoid, F.gelu,
    torch.relu, torch.sigmoid, torch.tanh,
    lambda x: F.hardtanh(x, -2.0, 3.5),
    lambda x: F.gelu(x, approximate="tanh"),
    lambda x: F.relu(x.clone(), inplace=True),
    lambda x: F.hardswish(x.clone(), inplace=True),
    nn.ReLU6(), nn.Hardtanh(-0.5, 0.5), nn.GELU(), nn.GELU("tanh"), nn.SiLU(), nn.Hardsigmoid(),
], ids=lambda f: getattr(f, "__name__", repr(f)))
def test_activation(fn):
    check_torch(fn, X, atol=ATOL, rtol=RTOL)


def test_gelu_forms_differ():
    """The two GELU forms are different functions; each must match its own torch form."""
    x = seeded(2, 64, low=-4.0, high=4.0)
    assert (F.gelu(x) - F.gelu(x, approximate="tanh")).abs().max() > 1e-4
    check_torch(lambda x: F.gelu(x, approximate="none"), x, atol=ATOL, rtol=RTOL)
    check_torch(lambda x: F.gelu(x, approximate="tanh"), x, atol=ATOL, rtol=RTOL)


def test_sigmoid_and_tanh_saturate_without_overflow():
    x = torch.tensor([-100.0, -30.0, -1e-3, 1e-3, 30.0, 100.0])
    check_torch(lambda x: (torch.sigmoid(x), torch.tanh(x), F.silu(x)), x, atol=ATOL, rtol=RTOL)
