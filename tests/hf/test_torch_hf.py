"""The ATen ops Hugging Face models add (frontends/torch_hf.py), each against torch."""
from __future__ import annotations

import torch

from tests.ops.checks import check_torch, op_names, seeded


def test_gather_along_each_dim():
    x = seeded(0, 3, 4, 5)
    idx = torch.tensor([[[0, 4, 3], [2, 2, 1]], [[1, 0, 3], [0, 0, 0]]])
    for dim, index in [(2, idx), (1, idx.clamp(0, 3)), (0, idx.clamp(0, 2))]:
        m = check_torch(lambda t, i, d=dim: torch.gather(t, d, i), x, index, atol=0, rtol=0)
        assert op_names(m)[-1] == "cuvil.gather"


def test_index_with_two_broadcast_index_tensors():
    x = seeded(1, 2, 5, 6, 3)
    rows = torch.tensor([[0], [4], [-1]])
    cols = torch.tensor([1, 5, 0, -2])
    check_torch(lambda t, r, c: t[:, r, c], x, rows, cols, atol=0, rtol=0)


def test_attention_mask_logic():
    a = seeded(2, 2, 7) > 0
    b = seeded(3, 2, 7) > 0.3
    check_torch(lambda p, q: (p & q) | ~(p | q), a, b, atol=0, rtol=0)
