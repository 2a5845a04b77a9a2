"""scatter (src, value, reduce), scatter_add, scatter_reduce (every reduction, with and
without the input), index_add, take_along_dim and repeat_interleave against torch:
several dims, duplicate and negative indices, indices smaller than the input, 0-d.
In the interpreter and natively."""
from __future__ import annotations

import pytest
import torch

from tests.ops.checks import check_torch, seeded

X = seeded(1, 4, 5)
IDX = torch.tensor([[0, 1, 2, 0, 3], [3, 3, 1, 0, 2], [1, 0, 0, 0, 3]])   # duplicates in every row
SRC = seeded(2, 3, 5)


@pytest.mark.parametrize("fn", [
    lambda x, s: torch.scatter_add(x, 0, IDX, s), lambda x, s: torch.scatter_add(x, 1, IDX[:, :3], s),
    lambda x, s: torch.scatter(x, 1, IDX[:2, :2] * 0 + torch.tensor([[0, 3]]), s),
    lambda x, s: torch.scatter(x, 0, IDX[:2, :4] % 3, 2.5),
    lambda x, s: torch.scatter(x, 0, IDX, s, reduce="add"),
    lambda x, s: torch.scatter(x, 0, IDX, s, reduce="multiply"),
])
def test_scatter(fn):
    check_torch(fn, X, SRC, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    check_torch(lambda x, s: torch.scatter_reduce(x, 0, IDX, s, reduce, include_self=include_self), X, SRC,
                atol=1e-5, rtol=1e-5)


def test_index_add_take_along_dim_repeat_interleave():
    idx = torch.tensor([2, 0, 2])
    check_torch(lambda x, s: x.index_add(1, idx, s, alpha=2.0), X, seeded(3, 4, 3), atol=1e-5, rtol=1e-5)
    check_torch(lambda x, s: x.index_add(0, idx, s), X, seeded(4, 3, 5), atol=1e-5, rtol=1e-5)
    neg = torch.tensor([[-1, 0, 2], [1, -5, 4], [0, 0, 0], [3, -2, 1]])
    check_torch(lambda x: torch.take_along_dim(x, neg, 1), X, atol=0, rtol=0)
    check_torch(lambda x: torch.take_along_dim(x, torch.tensor([3, 19, 0])), X, atol=0, rtol=0)
    check_torch(lambda x: torch.repeat_interleave(x, 3, dim=1), X, atol=0, rtol=0)
    check_torch(lambda x: torch.repeat_interleave(x * 2, 2), X, atol=0, rtol=0)


def test_scatter_of_0d():
    check_torch(lambda x, s: torch.scatter(x, 0, torch.tensor(0), s), torch.tensor(1.0), torch.tensor(5.0),
                atol=0, rtol=0)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    idx = torch.tensor([3, 0, 3])
    check_torch(lambda x, v: torch.index_put(x, (idx,), v, accumulate=accumulate), X, seeded(6, 3, 5),
                atol=1e-6, rtol=1e-6)
    if not accumulate:  # x[:, idx] = v: an index after a full slice
        def put_columns(x, v):
            y = x.clone()
            y[:, torch.tensor([4, 1])] = v
            return y
        check_torch(put_columns, X, seeded(7, 2), atol=1e-6, rtol=1e-6)
    mask = torch.tensor([True, False, True, True])
    check_torch(lambda x, v: torch.index_put(x, (mask,), v, accumulate=accumulate), X, seeded(8, 5),
                atol=1e-6, rtol=1e-6)


def test_masked_assignment_of_a_scalar():
    def fn(x):
        y = x.clone()
        y[y > 0.5] = 0.0
        return y
    check_torch(fn, X, atol=0, rtol=0)
