"""prod, any/all, logsumexp, var/std (and var_mean/std_mean), cumsum/cumprod against
torch: every dim, keepdim, 0-d tensors, integer and bool inputs, zeros, NaN and inf.
In the interpreter and natively (cuvil.reduce_prod, cuvil.cumsum, cuvil.cumprod)."""
from __future__ import annotations

import pytest
import torch

from tests.ops.checks import check_torch, op_names, seeded

TOL = dict(atol=1e-5, rtol=1e-5)
X = seeded(1, 3, 4, 5)


@pytest.mark.parametrize("fn", [
    lambda x: torch.cumsum(x, 0), lambda x: torch.cumsum(x, -1), lambda x: torch.cumsum(x, 1),
    lambda x: torch.cumprod(x, 2), lambda x: torch.cumprod(x, 0),
    lambda x: torch.cumsum(x, 1, dtype=torch.float64),
])
def test_cumulative(fn):
    module = check_torch(fn, X, **TOL)
    assert {"cuvil.cumsum", "cuvil.cumprod"} & set(op_names(module))


def test_cumulative_edges():
    check_torch(lambda x: torch.cumsum(x, 0), torch.tensor(2.5), atol=0, rtol=0)
    check_torch(lambda x: torch.cumprod(x, -1), torch.tensor([[1.0, float("inf"), 0.0, 2.0],
                                                              [float("nan"), 1.0, 2.0, 3.0]]), atol=0, rtol=0)
    mask = torch.tensor([[1, 1, 0, 1, 1], [0, 0, 1, 1, 1]])
    check_torch(lambda m: m.cumsum(-1) * m - 1, mask, atol=0, rtol=0)         # HF position ids
    check_torch(lambda m: torch.cumsum(m, 1), mask.bool(), atol=0, rtol=0)    # bool -> int64


@pytest.mark.parametrize("fn", [
    torch.prod, lambda x: torch.prod(x, 1), lambda x: torch.prod(x, -1, keepdim=True),
    lambda x: torch.logsumexp(x, 1), lambda x: torch.logsumexp(x, (0, 2), keepdim=True),
    torch.var, torch.std, lambda x: torch.var(x, 1, correction=0), lambda x: torch.std(x, (0, 2), keepdim=True),
    lambda x: torch.var(x, -1, unbiased=False), lambda x: torch.std(x, 2, correction=2),
    lambda x: torch.var_mean(x, 1), lambda x: torch.std_mean(x, (1, 2), keepdim=True),
])
def test_reductions(fn):
    check_torch(fn, X, **TOL)


def test_prod_of_zeros_negatives_and_integers():
    x = torch.tensor([[2.0, -3.0, 0.5], [0.0, 5.0, -1.0], [float("nan"), 1.0, 2.0]])
    check_torch(lambda t: torch.prod(t, 1), x, atol=0, rtol=0)
    check_torch(lambda t: torch.prod(t, 0), torch.tensor([[2, -3], [4, 5]]), atol=0, rtol=0)


@pytest.mark.parametrize("fn", [torch.any, torch.all, lambda x: torch.any(x, 1), lambda x: torch.all(x, -1, keepdim=True),
                                lambda x: torch.any(x, (0, 1))])
def test_any_all(fn):
    x = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [float("nan"), 2.0, -1.0]])
    check_torch(fn, x, atol=0, rtol=0)
    check_torch(fn, x > 0, atol=0, rtol=0)


def test_zero_dim_and_infinite():
    for fn in (torch.prod, torch.any, lambda t: torch.logsumexp(t, 0), lambda t: torch.var(t, 0, correction=0),
               lambda t: torch.prod(t, -1, keepdim=True), lambda t: torch.all(t, 0)):
        check_torch(fn, torch.tensor(-1.5), atol=1e-6, rtol=1e-6)
    inf = float("inf")
    rows = torch.tensor([[-inf, -inf, -inf], [1.0, inf, 2.0], [1.0, 2.0, float("nan")], [1e30, 1e30, -1e30]])
    check_torch(lambda t: torch.logsumexp(t, 1), rows, atol=1e-6, rtol=1e-6)
    check_torch(lambda t: torch.var(t, 1), torch.ones(2, 1), atol=0, rtol=0)  # N - correction = 0: NaN
