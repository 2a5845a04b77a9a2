"""torch.einsum against torch: matmul and attention shapes, implicit output, '...',
diagonals and traces, outer products, sums of letters only one operand has, three
operands, size-1 broadcasting. In the interpreter and natively."""
from __future__ import annotations

import pytest
import torch

from tests.ops.checks import check_torch, seeded


@pytest.mark.parametrize("eq, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("bhqk,bhkd->bqhd", [(2, 3, 4, 5), (2, 3, 5, 8)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ijk->", [(2, 3, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("bij,bjk->bik", [(1, 3, 4), (5, 4, 2)]),
    ("ijk,ik->j", [(2, 3, 4), (2, 4)]),
])
def test_einsum(eq, shapes):
    xs = [seeded(i + 1, *s) for i, s in enumerate(shapes)]
    check_torch(lambda *t: torch.einsum(eq, *t), *xs, atol=1e-5, rtol=1e-5)
