"""mean / sum / amax / amin against torch over random subsets of dims, with and
without keepdim, and the integer sums torch promotes to int64."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.ops.checks import check_torch, seeded

ATOL, RTOL = 1e-5, 1e-5  # sums of up to a few hundred O(1) terms
REPO_ROOT = Path(__file__).resolve().parents[2]

REDUCTIONS = {
    "sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin,
}


@st.composite
def reduction(draw, names):
    name = draw(st.sampled_from(names))
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    rank = len(shape)
    dims = draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda d: d % rank))
    return name, shape, dims, draw(st.booleans())


def check_reduction(name, shape, dims, keepdim):
    fn = REDUCTIONS[name]
    check_torch(lambda x: fn(x, dims, keepdim=keepdim), seeded(len(shape), *shape), atol=ATOL, rtol=RTOL,
                name=f"{name}(dims={dims}, keepdim={keepdim})")


@given(reduction(["sum", "mean"]))
def test_sum_mean_dims(case):
    check_reduction(*case)


@given(reduction(["amax", "amin"]))
def test_max_min_dims(case):
    check_reduction(*case)


REPRO = """
import sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + "/compiler"]
import torch
from tests.ops.checks import check_torch, seeded
for n in (110, 120):
    check_torch(lambda x: torch.amax(x, 0), seeded(n, n), atol=0, rtol=0)
"""


def test_native_max_reduction_does_not_abort():
    result = subprocess.run([sys.executable, "-c", REPRO, str(REPO_ROOT)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("fn", [
    torch.sum, torch.mean, lambda x: x.sum(-1), lambda x: x.mean((0, 2), keepdim=True),
    lambda x: x.amax(1), lambda x: x.amax((-1, -2), keepdim=True), lambda x: x.sum(dtype=torch.float64),
])
def test_reduce_forms(fn):
    check_torch(fn, seeded(1, 3, 4, 5) + 0.5, atol=ATOL, rtol=RTOL)


def test_long_reduction():
    x = seeded(2, 2, 4096) + 1.0
    check_torch(lambda x: (x.sum(-1), x.mean(-1)), x, atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_sum_promotes_to_int64(dtype):
    x = torch.randint(-3, 4, (3, 5), generator=torch.Generator().manual_seed(3)).to(dtype)
    check_torch(lambda x: (x.sum(), x.sum(1), x.sum(0, keepdim=True)), x, atol=0, rtol=0)


def test_integer_amax():
    x = torch.randint(-100, 100, (3, 5), generator=torch.Generator().manual_seed(4))
    check_torch(lambda x: (x.amax(1), x.amin(0)), x, atol=0, rtol=0)
