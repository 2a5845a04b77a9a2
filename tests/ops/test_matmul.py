"""The matmul family against torch: linear, addmm, mm, bmm, matmul (1-D operands and
batch broadcasting)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from tests.ops.checks import check_torch, seeded

ATOL, RTOL = 1e-5, 1e-4  # float32 dot products of up to ~64 terms


def linear(cin, cout, bias=True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(cin, cout, bias=bias)


@pytest.mark.parametrize("module, shape", [
    (linear(8, 5), (3, 8)),
    (linear(8, 5, bias=False), (3, 8)),
    (linear(8, 5), (2, 4, 8)),       # leading batch dims
    (linear(8, 5), (8,)),            # 1-D input
    (linear(64, 3), (2, 64)),
])
def test_linear(module, shape):
    check_torch(module, seeded(1, *shape), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("fn, shapes", [
    (lambda b, x, w: torch.addmm(b, x, w), [(5,), (3, 4), (4, 5)]),
    (lambda b, x, w: torch.addmm(b, x, w), [(3, 5), (3, 4), (4, 5)]),
    (lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0), [(1, 5), (3, 4), (4, 5)]),
    (lambda x, w: torch.mm(x, w), [(3, 4), (4, 5)]),
    (lambda x, w: torch.bmm(x, w), [(2, 3, 4), (2, 4, 5)]),
    (lambda x, w: x @ w, [(4,), (4, 5)]),          # vector @ matrix
    (lambda x, w: x @ w, [(3, 4), (4,)]),          # matrix @ vector
    (lambda x, w: x @ w, [(4,), (4,)]),            # dot product, 0-d result
    (lambda x, w: x @ w, [(2, 3, 4), (4,)]),       # batched matrix @ vector
    (lambda x, w: x @ w, [(4,), (2, 4, 5)]),       # vector @ batched matrix
    (lambda x, w: x @ w.transpose(-1, -2), [(2, 3, 4), (2, 5, 4)]),
])
def test_matmul_family(fn, shapes):
    check_torch(fn, *(seeded(i, *s) for i, s in enumerate(shapes)), atol=ATOL, rtol=RTOL)


@st.composite
def batched_matmul_shapes(draw):
    """Two operand shapes whose leading dims broadcast (each side may drop or 1 a dim)."""
    m, k, n = draw(st.integers(1, 5)), draw(st.integers(1, 6)), draw(st.integers(1, 5))
    batch = draw(st.lists(st.integers(1, 3), max_size=3))
    a_batch, b_batch = [], []
    for d in batch:
        a_batch.append(draw(st.sampled_from([d, 1])))
        b_batch.append(draw(st.sampled_from([d, 1])))
    a_batch = a_batch[draw(st.integers(0, len(a_batch))):]
    b_batch = b_batch[draw(st.integers(0, len(b_batch))):]
    return (*a_batch, m, k), (*b_batch, k, n)


@given(batched_matmul_shapes(), st.integers(0, 2 ** 16))
def test_matmul_batch_broadcasting(shapes, seed):
    a, b = shapes
    check_torch(torch.matmul, seeded(seed, *a), seeded(seed + 1, *b), atol=ATOL, rtol=RTOL)
