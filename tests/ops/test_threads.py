"""Kernels split across the runtime's threads compute every output element exactly as
one thread does: softmax, log-softmax, layer norm and transpose split their rows, the
packed GEMMs hand each thread whole panels (matmul, and convolutions that pack each
panel before multiplying it), max pooling and global average pooling split their
planes. Two-thread results must equal one-thread results bit for bit and match torch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import cuvil


class _Rows(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(384)
        self.proj = nn.Linear(384, 200)   # M = 2 * 100 rows: ragged row groups

    def forward(self, x, s):
        y = self.proj(self.norm(x))                                   # [2, 100, 200]
        a = torch.softmax(s, dim=-1) + torch.log_softmax(s, dim=1)    # [4, 12, 64, 96]
        t = a.transpose(1, 2).contiguous()                            # [4, 64, 12, 96]
        return y, t


class _Convs(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.c1 = nn.Conv2d(8, 20, 3, padding=1)              # 40 x 38 outputs: 95 panels
        self.c2 = nn.Conv2d(20, 24, 3, stride=2, padding=1)   # 20 x 19: 24 panels
        self.c3 = nn.Conv2d(24, 36, 1)

    def forward(self, x):
        a = torch.relu(self.c1(x))
        y = torch.relu(self.c2(a))
        z = self.c3(nn.functional.max_pool2d(y, 3, 1, 1))      # 48 planes of 20 x 19
        return z, nn.functional.adaptive_avg_pool2d(a, 1)      # 40 global averages of 40 x 38


class _FewPanels(nn.Module):
    """Convs of 9 and 13 well-filled panels (fewer than kernels.FUSED_PACK_PANELS): all
    panels packed, then each thread takes a range of them (with 256-bit vectors)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.c1 = nn.Conv2d(16, 40, 3, padding=1)
        self.c2 = nn.Conv2d(40, 28, 1)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)))


class _Stem(nn.Module):
    """A 3-channel strided stem: its padded input copy splits each plane into bands of
    rows (kernels.PADDED_COPY_ITEMS), and 2 of 3 planes would leave a thread idle."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.c1 = nn.Conv2d(3, 16, 7, stride=2, padding=3)
        self.c2 = nn.Conv2d(16, 8, 3, stride=2, padding=(1, 0))

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)))


@pytest.mark.parametrize("make, shapes", [
    (_Rows, [(2, 100, 384), (4, 12, 64, 96)]),
    (_Convs, [(2, 8, 40, 38)]),
    (_FewPanels, [(1, 16, 14, 14)]),
    (_Stem, [(2, 3, 61, 58)]),
], ids=["rows", "convs", "few-panels", "stem"])
def test_two_threads_give_the_bits_of_one(make, shapes):
    model = make().eval()
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    with torch.no_grad():
        ref = model(*(torch.from_numpy(x) for x in xs))
    ref = ref if isinstance(ref, tuple) else (ref,)
    one = cuvil.compile(model, tuple(torch.from_numpy(x) for x in xs), threads=1)
    two = cuvil.compile(model, tuple(torch.from_numpy(x) for x in xs), threads=2)
    got1, got2 = one(*xs), two(*xs)
    for r, a, b in zip(ref, got1, got2):
        np.testing.assert_array_equal(a, b)
        r = r.numpy()
        np.testing.assert_allclose(b, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())
