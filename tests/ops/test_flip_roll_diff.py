"""flip, roll and diff of computed tensors against torch: several dims, negative dims
and shifts, shifts past the size, the flattened roll, diff's n, prepend/append and bool
inputs. In the interpreter and natively."""
from __future__ import annotations

import pytest
import torch

from tests.ops.checks import check_torch, op_names, seeded

X = seeded(1, 3, 4, 5)


@pytest.mark.parametrize("fn", [
    lambda x: torch.flip(x * 2, [0]), lambda x: torch.flip(x + 1, [-1, 1]), lambda x: torch.flip(x[0, 0, 0] * 2, []),
    lambda x: torch.roll(x * 2, 1, 0), lambda x: torch.roll(x + 1, (-2, 7), (2, -2)), lambda x: torch.roll(x, 3),
    lambda x: torch.roll(x, 0, 1),
    lambda x: torch.diff(x), lambda x: torch.diff(x, n=2, dim=0), lambda x: torch.diff(x, n=3, dim=1),
    lambda x: torch.diff(x, dim=1, prepend=x[:, :2], append=x[:, -1:]), lambda x: torch.diff(x, n=0),
    lambda x: torch.diff(x, n=9, dim=1),                                      # past the size: empty
])
def test_flip_roll_diff(fn):
    check_torch(fn, X, atol=1e-6, rtol=1e-6)


def test_flip_uses_a_gather_of_the_computed_tensor():
    module = check_torch(lambda x: torch.flip(torch.relu(x), [2]), X, atol=0, rtol=0)
    assert "cuvil.gather" in op_names(module)


def test_diff_of_bool_and_integers():
    check_torch(lambda m: torch.diff(m), torch.tensor([[True, False, False, True]]), atol=0, rtol=0)
    check_torch(lambda m: torch.diff(m, dim=0), torch.tensor([[3, 1], [-4, 7], [0, 0]]), atol=0, rtol=0)
