"""Elementwise math lowered as compositions (frontends/torch_math.py) against torch:
rounding with its ties and huge values, trigonometric and hyperbolic functions over
their domains and edges, expm1/log1p near 0, erfinv near +-1, fmod and remainder with
mixed signs; NaN and inf where torch defines them. In the interpreter and natively."""
from __future__ import annotations

import pytest
import torch

from tests.ops.checks import check_torch, seeded

SPECIAL = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf")])


def _wide(seed: int) -> torch.Tensor:
    """Normal values at several scales, exact ties (k + 0.5) and integers past 2**23."""
    x = torch.cat([seeded(seed, 64) * 3, seeded(seed + 1, 32) * 1e4, torch.arange(-6, 6) + 0.5,
                   torch.tensor([2.0 ** 23 + 1, -(2.0 ** 24) - 2, 1e30, -0.49999997, 0.49999997, 2.5, -2.5])])
    return torch.cat([x, SPECIAL]).reshape(3, -1)


@pytest.mark.parametrize("fn", [torch.trunc, torch.floor, torch.ceil, torch.round, torch.sign, torch.frac])
def test_rounding(fn):
    check_torch(fn, _wide(1), atol=0, rtol=0)


@pytest.mark.parametrize("decimals", [2, -1])
def test_round_decimals(decimals):
    """Within one float32 ulp: the compiler turns the division by 10**d into a product."""
    check_torch(lambda x: torch.round(x, decimals=decimals), _wide(1), atol=0, rtol=1.2e-7)


def test_rounding_of_0d_and_integers():
    check_torch(torch.floor, torch.tensor(-2.5), atol=0, rtol=0)
    check_torch(lambda x: torch.sign(x), torch.tensor([-3, 0, 7]), atol=0, rtol=0)
    check_torch(lambda x: torch.round(x) + torch.ceil(x), torch.tensor([[-3, 0, 7]]), atol=0, rtol=0)


@pytest.mark.parametrize("fn, x, tol", [
    (torch.tan, seeded(2, 4, 50) * 1.5, 1e-6),
    (torch.atan, torch.cat([seeded(3, 200) * 5, torch.tensor([1e6, -1e20, 0.41421, 2.4142]), SPECIAL]), 3e-7),
    (torch.asin, torch.cat([torch.linspace(-1, 1, 201), torch.tensor([1.5, -2.0, 0.9999999]), SPECIAL]), 1e-6),
    (torch.acos, torch.cat([torch.linspace(-1, 1, 201), torch.tensor([1.5, -2.0, 0.9999999]), SPECIAL]), 1e-6),
    (torch.sinh, torch.cat([seeded(4, 200) * 4, torch.tensor([1e-3, -1e-6, 0.0299, 0.0301, 80.0]), SPECIAL]), 1e-6),
    (torch.cosh, torch.cat([seeded(5, 200) * 4, torch.tensor([80.0, -1e-6]), SPECIAL]), 1e-6),
    (torch.expm1, torch.cat([seeded(6, 200) * 3, torch.tensor([1e-7, -1e-3, 0.0099, 0.0101, 100.0]), SPECIAL]), 1e-6),
    (torch.log1p, torch.cat([seeded(7, 200).abs() * 5 - 0.9, torch.tensor([1e-7, -1e-3, -1.0, -2.0, 1e30]),
                             SPECIAL]), 1e-6),
    (torch.erfinv, torch.cat([torch.linspace(-0.999, 0.999, 301), torch.tensor([1.0, -1.0, 1.5, 0.99999])]), 5e-6),
])
def test_unary(fn, x, tol):
    check_torch(fn, x, atol=tol, rtol=tol)


def test_atan2_quadrants():
    y = torch.cat([seeded(8, 100), torch.tensor([0.0, 1.0, -1.0, 0.0, 3.0, -3.0])])
    x = torch.cat([seeded(9, 100), torch.tensor([0.0, 0.0, 0.0, -2.0, -1e-30, -1e-30])])
    check_torch(torch.atan2, y, x, atol=3e-7, rtol=3e-7)
    check_torch(lambda a: torch.atan2(a, torch.tensor(-1.0)), y, atol=3e-7, rtol=3e-7)


@pytest.mark.parametrize("fn", [torch.fmod, torch.remainder])
def test_fmod_remainder(fn):
    a = torch.cat([seeded(10, 100) * 10, torch.tensor([5.0, -5.0, 5.0, -5.0, 7.5, 0.0])])
    b = torch.cat([seeded(11, 100) * 3, torch.tensor([3.0, 3.0, -3.0, -3.0, 2.5, 2.0])])
    check_torch(fn, a, b, atol=1e-5, rtol=1e-5)
    check_torch(lambda x: fn(x, -1.5), a, atol=1e-5, rtol=1e-5)
    check_torch(fn, torch.tensor([7, -7, 7, -7]), torch.tensor([3, 3, -3, -3]), atol=0, rtol=0)
