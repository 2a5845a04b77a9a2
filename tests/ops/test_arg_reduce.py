"""argmax / argmin and torch.max / torch.min along a dim (values and indices) and of a
whole tensor, against torch: through the interpreter and native code (check_torch).
Indices and selected values are compared exactly; ties keep the first index, and a NaN
wins (the first NaN), as in torch."""
from __future__ import annotations

import pytest
import torch

from tests.ops.checks import check_torch, seeded


def with_ties_and_nan(*shape):
    x = seeded(1, *shape)
    flat = x.view(-1)
    flat[::5] = 2.5  # ties: the first must win
    if flat.numel() > 7:
        flat[7] = float("nan")
    return x


SHAPES = [(), (9,), (4, 7), (2, 3, 5), (2, 1, 3, 4)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fn", [torch.argmax, torch.argmin], ids=["argmax", "argmin"])
def test_arg_reduce_every_dim(fn, shape):
    x = with_ties_and_nan(*shape)
    dims = range(-len(shape), len(shape)) if shape else [0, -1]
    check_torch(lambda x: (fn(x), fn(x, keepdim=True), *[fn(x, d, keepdim=k) for d in dims for k in (False, True)]),
                x, atol=0, rtol=0)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fn", [torch.max, torch.min], ids=["max", "min"])
def test_max_min_values_and_indices(fn, shape):
    x = with_ties_and_nan(*shape)
    dims = range(-len(shape), len(shape)) if shape else [0]
    check_torch(lambda x: (fn(x), *[fn(x, d, keepdim=k) for d in dims for k in (False, True)]), x, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_arg_reduce_integers(dtype):
    x = torch.tensor([[3, 9, 9, 1], [0, 7, 0, 1], [1, 1, 1, 1]]).to(dtype)
    check_torch(lambda x: (torch.argmax(x, 1), torch.argmin(x, 0), torch.max(x, 1)), x, atol=0, rtol=0)


def test_max_min_of_bool_along_a_dim():
    x = torch.tensor([[True, False, True], [False, False, False]])
    check_torch(lambda x: (torch.max(x, 1), torch.min(x, 0)), x, atol=0, rtol=0)


def test_arg_reduce_of_a_computed_tensor_fuses_nothing_away():
    """argmax of logits after a matmul and softmax (a greedy decoder's step)."""
    w, x = seeded(2, 16, 40), seeded(3, 5, 16)
    check_torch(lambda x, w: torch.softmax(x @ w, -1).argmax(-1), x, w, atol=0, rtol=0)
