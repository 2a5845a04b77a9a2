"""batch_norm with the batch's own statistics (training=True) and native_batch_norm's
extra outputs, division with rounding modes, logical and/or of non-bool tensors and
softmax of 0-d tensors or into float64, against torch. Interpreter and native."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from tests.ops.checks import check_torch, seeded

X = seeded(1, 4, 3, 5, 2)


def test_batch_norm_of_the_batch():
    w, b = seeded(2, 3), seeded(3, 3)
    check_torch(lambda x: F.batch_norm(x, None, None, w, b, training=True, eps=1e-3), X, atol=1e-5, rtol=1e-5)
    check_torch(lambda x: F.batch_norm(x, None, None, training=True), seeded(4, 6, 3), atol=1e-5, rtol=1e-5)
    check_torch(lambda x: torch.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5), X, atol=1e-5, rtol=1e-5)


def test_native_batch_norm_eval_outputs():
    rm, rv = seeded(5, 3), seeded(6, 3).abs() + 0.5
    check_torch(lambda x: torch.native_batch_norm(x, None, None, rm, rv, False, 0.1, 1e-5), X,
                atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
def test_div_rounding(mode):
    a = torch.cat([seeded(7, 50) * 10, torch.tensor([7.0, -7.0, 7.0, -7.0, 0.0, 1.0])])
    b = torch.cat([seeded(8, 50) * 3, torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 0.0])])
    check_torch(lambda x, y: torch.div(x, y, rounding_mode=mode), a, b, atol=1e-6, rtol=1e-6)
    check_torch(lambda x, y: torch.div(x, y, rounding_mode=mode), torch.tensor([7, -7, 9]), torch.tensor([2, 2, -4]),
                atol=0, rtol=0)


def test_logical_of_numbers():
    a, b = torch.tensor([0.0, 1.5, -2.0, float("nan"), 0.0]), torch.tensor([3, 0, 1, 0, 0])
    check_torch(torch.logical_and, a, b, atol=0, rtol=0)
    check_torch(torch.logical_or, a, b, atol=0, rtol=0)


def test_softmax_0d_and_float64():
    check_torch(lambda x: torch.softmax(x, 0), torch.tensor(3.0), atol=0, rtol=0)
    check_torch(lambda x: torch.log_softmax(x, -1, dtype=torch.float64), seeded(9, 2, 7), atol=1e-6, rtol=1e-6)


def test_creation_like_keeps_float64():
    x = seeded(10, 2, 3)
    check_torch(lambda t: torch.zeros_like(t, dtype=torch.float64) + t.new_full((2, 3), 2.5, dtype=torch.float64),
                x, atol=0, rtol=0)


def test_products_with_an_empty_dim():
    check_torch(lambda a, b: a @ b, torch.ones(3, 0), torch.ones(0, 4), atol=0, rtol=0)
    check_torch(lambda c, a, b: torch.addmm(c, a, b, beta=2.0), seeded(11, 3, 4), torch.ones(3, 0), torch.ones(0, 4),
                atol=0, rtol=0)


def test_zero_d_and_empty_corners():
    """prelu of a 0-d tensor, gather from a 0-d tensor or by an empty index, cat of
    empty tensors: the shapes torch gives."""
    check_torch(lambda x, w: torch.nn.functional.prelu(x, w), torch.tensor(-2.0), torch.tensor([0.25]),
                atol=0, rtol=0)
    check_torch(lambda x: torch.gather(x, 0, torch.tensor([0, 0])), torch.tensor(3.0), atol=0, rtol=0)
    check_torch(lambda x: torch.gather(x, 0, torch.zeros(0, dtype=torch.int64)) + 1, seeded(12, 5), atol=0, rtol=0)
    check_torch(lambda x: torch.cat([x[:0], x[:0]]), seeded(13, 4), atol=0, rtol=0)
