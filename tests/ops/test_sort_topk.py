"""sort, argsort and topk against torch: any dim, descending, ties (stable order), NaN
and inf, 0-d tensors, top-k largest and smallest. Values and indices, in the
interpreter and natively."""
from __future__ import annotations

import pytest
import torch

from tests.ops.checks import check_torch, seeded

X = seeded(1, 3, 6, 5)
NAN, INF = float("nan"), float("inf")
SPECIAL = torch.tensor([[3.0, NAN, -INF, 1.0, 3.0, INF, -2.0, 1.0], [0.0, -0.0, 5.0, NAN, NAN, 2.0, 2.0, -1.0]])


@pytest.mark.parametrize("fn", [
    lambda x: torch.sort(x), lambda x: torch.sort(x, 1, descending=True), lambda x: torch.sort(x, dim=0, stable=True),
    lambda x: torch.argsort(x, -1), lambda x: torch.argsort(x, 1, descending=True),
    lambda x: torch.topk(x, 3), lambda x: torch.topk(x, 2, dim=1, largest=False), lambda x: torch.topk(x, 1, 0),
])
def test_sort_topk(fn):
    check_torch(fn, X, atol=0, rtol=0)


@pytest.mark.parametrize("fn", [
    lambda x: torch.sort(x, stable=True), lambda x: torch.sort(x, descending=True, stable=True),
    lambda x: torch.sort(x, dim=0, stable=True),
])
def test_ties_nan_inf(fn):
    check_torch(fn, SPECIAL, atol=0, rtol=0)


@pytest.mark.parametrize("largest", [True, False])
def test_topk_nan_inf(largest):
    """torch leaves the order of tied top-k entries open: these rows have no ties."""
    x = torch.tensor([[3.0, NAN, -INF, 1.0, 2.5, INF, -2.0, 0.5], [0.0, -3.0, 5.0, NAN, 4.0, 2.0, 1.0, -1.0]])
    check_torch(lambda t: torch.topk(t, 4, largest=largest), x, atol=0, rtol=0)


def test_zero_d():
    check_torch(lambda x: torch.sort(x), torch.tensor(1.5), atol=0, rtol=0)
    check_torch(lambda x: torch.topk(x, 1), torch.tensor(1.5), atol=0, rtol=0)
