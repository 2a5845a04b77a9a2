"""Binary and unary arithmetic against torch: broadcasting, scalar operands, alpha,
integer dtypes and promotion, and clamp with scalar and tensor bounds."""
from __future__ import annotations

import operator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from tests.ops.checks import check_torch, seeded

ATOL, RTOL = 1e-6, 1e-6
POW_RTOL = 1e-5  # torch's float32 pow is within a few ulp

BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2.5),
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=-3),
}


def positive(seed, *shape):
    return seeded(seed, *shape, low=0.5, high=3.0)


@given(st.sampled_from(sorted(BINARY)),
       mutually_broadcastable_shapes(num_shapes=2, max_dims=4, min_side=1, max_side=4),
       st.integers(0, 2 ** 16))
def test_binary_broadcasting(name, shapes, seed):
    a, b = shapes.input_shapes
    # divisors kept away from zero; magnitudes either side of 1
    check_torch(BINARY[name], seeded(seed, *a), positive(seed + 1, *b) * torch.tensor(-1.0) ** seed,
                atol=ATOL, rtol=RTOL, name=name)


@given(mutually_broadcastable_shapes(num_shapes=2, max_dims=3, min_side=1, max_side=4), st.integers(0, 2 ** 16))
def test_pow_broadcasting(shapes, seed):
    a, b = shapes.input_shapes
    check_torch(torch.pow, positive(seed, *a), seeded(seed + 1, *b), atol=ATOL, rtol=POW_RTOL)


@pytest.mark.parametrize("fn", [
    lambda x: x + 2.5, lambda x: 2.5 + x, lambda x: x - 1.25, lambda x: 1.25 - x,
    lambda x: x * -3.0, lambda x: x / 7.0, lambda x: 7.0 / x, lambda x: x + 2,
    lambda x: x ** 2, lambda x: x ** 0.5, lambda x: x ** -1.5, lambda x: 2.0 ** x,
    lambda x: torch.pow(x, 3), lambda x: torch.rsub(x, 2.0, alpha=3),
])
def test_scalar_operand(fn):
    check_torch(fn, positive(1, 3, 5), atol=ATOL, rtol=POW_RTOL)


@pytest.mark.parametrize("fn, lo, hi", [
    (torch.sqrt, 0.0, 9.0), (torch.rsqrt, 0.01, 9.0), (torch.exp, -20.0, 20.0), (torch.neg, -5.0, 5.0),
    (operator.neg, -5.0, 5.0), (torch.abs, -5.0, 5.0), (torch.log, 0.01, 50.0),
    (torch.reciprocal, 0.1, 5.0), (torch.erf, -3.0, 3.0),
])
def test_unary(fn, lo, hi):
    check_torch(fn, seeded(2, 4, 25, low=lo, high=hi), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("fn", [
    lambda x: torch.clamp(x, -1.0, 2.0), lambda x: torch.clamp(x, min=0.5), lambda x: torch.clamp(x, max=-0.5),
    lambda x: x.clamp(-1, 1), lambda x: torch.clamp_min(x, 0.25), lambda x: torch.clamp_max(x, 0.25),
])
def test_clamp_scalar_bounds(fn):
    check_torch(fn, seeded(3, 4, 8) * 3, atol=0, rtol=0)


@given(mutually_broadcastable_shapes(num_shapes=3, max_dims=3, min_side=1, max_side=4), st.integers(0, 2 ** 16))
def test_clamp_tensor_bounds_broadcast(shapes, seed):
    x, lo, hi = shapes.input_shapes
    check_torch(torch.clamp, seeded(seed, *x) * 2, seeded(seed + 1, *lo) - 1, seeded(seed + 2, *hi) + 1,
                atol=0, rtol=0)


def ints(seed, *shape, low=-50, high=50, dtype=torch.int64):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("fn, args", [
    (operator.add, (ints(1, 3, 4), ints(2, 4))),
    (operator.sub, (ints(1, 3, 4), ints(2, 3, 1))),
    (operator.mul, (ints(1, 3, 4), ints(2, 1, 4))),
    (lambda a: a * 3 - 1, (ints(1, 3, 4),)),
    (operator.add, (ints(1, 3, 4, dtype=torch.int32), ints(2, 3, 4, dtype=torch.int32))),
    (lambda a: torch.clamp(a, -10, 10), (ints(1, 3, 4),)),
    (operator.neg, (ints(1, 3, 4),)),
    (torch.abs, (ints(1, 3, 4),)),
    (operator.truediv, (ints(1, 3, 4), ints(2, 3, 4, low=1, high=9))),            # true division -> f32
    (lambda a, b: torch.div(a, b, rounding_mode="trunc"), (ints(1, 3, 4), ints(2, 3, 4, low=1, high=9))),
    (lambda a: a + 0.5, (ints(1, 3, 4),)),                                        # int + float -> f32
    (lambda a, b: a * b, (ints(1, 3, 4), seeded(2, 3, 4))),                       # int * f32 tensor
    (lambda a, b: torch.div(a, b, rounding_mode="trunc"), (seeded(1, 3, 4) * 9, positive(2, 3, 4))),
])
def test_integer_and_promotion(fn, args):
    check_torch(fn, *args, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("fn", [operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne])
def test_compare(fn):
    a = torch.tensor([[-1.0, 0.0, 1.0, 2.0], [2.0, 2.0, -3.0, 0.5]])
    b = torch.tensor([0.0, 0.0, 1.0, 3.0])  # broadcast, with ties
    check_torch(fn, a, b, atol=0, rtol=0)


def test_zero_dim_result_with_scalar_operand():
    """Python scalars become 0-d constants; a 0-d result must stay 0-d."""
    check_torch(lambda x: x.sum() * 2 + 1, seeded(4, 3, 4), atol=1e-5, rtol=1e-6)
