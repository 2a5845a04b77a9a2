"""Data-movement ops against torch, exactly (atol = rtol = 0): view, reshape, flatten,
permute, transpose, expand, unsqueeze, squeeze, cat, split, chunk, unbind, slice,
select, narrow."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.ops.checks import check_torch, seeded

EXACT = dict(atol=0, rtol=0)
X = seeded(1, 2, 3, 4, 5)


@pytest.mark.parametrize("fn", [
    lambda x: x.view(6, 20), lambda x: x.view(-1), lambda x: x.reshape(2, -1, 5), lambda x: x.reshape(120, 1),
    lambda x: torch.flatten(x), lambda x: torch.flatten(x, 1), lambda x: x.flatten(1, 2), lambda x: x.flatten(-2),
    lambda x: x.unflatten(2, (2, 2)),
    lambda x: x.permute(0, 2, 3, 1), lambda x: x.permute(3, 2, 1, 0), lambda x: x.permute(0, -1, 1, 2),
    lambda x: x.transpose(1, 2), lambda x: x.transpose(-1, 0), lambda x: x.swapaxes(0, 3),
    lambda x: x.unsqueeze(0), lambda x: x.unsqueeze(-1), lambda x: x.unsqueeze(2),
    lambda x: x[:, :1].squeeze(1), lambda x: x[:1, :, :1].squeeze(), lambda x: x[:1].squeeze(-4),
    lambda x: x.permute(0, 2, 1, 3).reshape(8, 15),        # reshape after a transpose
    lambda x: x.transpose(1, 2).contiguous().view(2, 4, 15),
])
def test_view_ops(fn):
    check_torch(fn, X, **EXACT)


@pytest.mark.parametrize("fn, shape", [
    (lambda x: x.expand(3, 4), (1, 4)),
    (lambda x: x.expand(2, 3, 4), (3, 1)),         # new leading dim
    (lambda x: x.expand(-1, 5, -1), (2, 1, 3)),
    (lambda x: torch.broadcast_to(x, (4, 2, 3)), (2, 1)),
    (lambda x: x.t(), (3, 4)),
    (lambda x: x.T, (3, 4)),
])
def test_expand_and_t(fn, shape):
    check_torch(fn, seeded(2, *shape), **EXACT)


@pytest.mark.parametrize("fn", [
    lambda x: x[1], lambda x: x[:, -1], lambda x: x[..., 2], lambda x: x.select(2, -2),
    lambda x: x[:, 1:], lambda x: x[:, :, 1:3], lambda x: x[..., ::2], lambda x: x[:, :, 1::2, 4:],
    lambda x: x[:, -2:], lambda x: x[..., 1:-1], lambda x: x[:, :, -100:100], lambda x: x[:, 3:1],
    lambda x: x.narrow(3, 1, 3), lambda x: x[0, 1:, 2, ::3],
])
def test_slice_and_select(fn):
    check_torch(fn, X, **EXACT)


@pytest.mark.parametrize("fn", [
    lambda x: x.split(2, dim=3), lambda x: x.split([1, 3, 1], dim=-1), lambda x: torch.split(x, 1, 1),
    lambda x: x.chunk(2, dim=2), lambda x: x.chunk(3, dim=3), lambda x: x.unbind(1), lambda x: x.unbind(-1),
])
def test_split(fn):
    check_torch(fn, X, **EXACT)


@pytest.mark.parametrize("fn, shapes", [
    (lambda a, b: torch.cat([a, b]), [(2, 3), (4, 3)]),
    (lambda a, b: torch.cat([a, b], dim=1), [(2, 3), (2, 1)]),
    (lambda a, b, c: torch.cat((a, b, c), dim=-1), [(2, 3, 1), (2, 3, 2), (2, 3, 4)]),
    (lambda a: torch.cat([a, a, a], 0), [(2, 2)]),
    (lambda a, b: torch.concat([a, b], -2), [(1, 2, 3), (1, 4, 3)]),
])
def test_cat(fn, shapes):
    check_torch(fn, *(seeded(i, *s) for i, s in enumerate(shapes)), **EXACT)


def test_expand_as():
    check_torch(lambda x, y: x.expand_as(y) + y, seeded(1, 3, 1), seeded(2, 2, 3, 4), **EXACT)


def test_cat_of_integers():
    a, b = torch.arange(6).reshape(2, 3), torch.arange(3).reshape(1, 3)
    check_torch(lambda a, b: torch.cat([a, b]), a, b, **EXACT)


@given(st.permutations(range(4)), st.integers(1, 3))
def test_permute_any(perm, size):
    check_torch(lambda x: x.permute(*perm), seeded(size, size, size + 1, 2, 3), **EXACT)


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_slice_any(shape, data):
    dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
    n = shape[dim]
    start = data.draw(st.integers(-n - 1, n + 1), label="start")
    stop = data.draw(st.integers(-n - 1, n + 1), label="stop")
    step = data.draw(st.integers(1, 3), label="step")
    index = (slice(None),) * dim + (slice(start, stop, step),)
    check_torch(lambda x: x[index] * 1, seeded(n, *shape), **EXACT, name=f"x[{index}]")


@pytest.mark.parametrize("shape, perm", [
    ((2, 128, 12, 32), (0, 2, 1, 3)),   # attention heads: rows of 32 kept, whole vectors
    ((2, 128, 12, 32), (0, 2, 3, 1)),   # keys transposed: 16 x 16 blocks through registers
    ((3, 37, 5), (1, 0, 2)),            # rows smaller than two vectors... a lane tail at 512 bits
    ((4, 3, 290), (1, 0, 2)),           # long rows: a loop of vectors and a scalar tail
    ((48, 64), (1, 0)),                 # a plain 2-D transpose in blocks
    ((2, 40, 24), (0, 2, 1)),           # 24 is no multiple of 16: element by element
])
def test_transposes_of_rows_and_blocks(shape, perm):
    """Transposes that keep the last dim copy rows in vectors; those that turn the input's
    rows into the output's columns go vw x vw blocks at a time through registers. One and
    two threads give the same bits as torch."""
    import cuvil
    x = seeded(30, *shape)
    fn = lambda x: x.permute(*perm) * 1.0  # noqa: E731  (a copy, not a view)
    check_torch(fn, x, **EXACT)

    class _M(torch.nn.Module):
        def forward(self, x):
            return fn(x)
    for threads in (1, 2):
        got = cuvil.compile(_M(), (x,), threads=threads)(x.numpy())[0]
        torch.testing.assert_close(torch.from_numpy(got), fn(x), rtol=0, atol=0)
