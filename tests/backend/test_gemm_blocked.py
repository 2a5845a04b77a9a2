"""The L1-blocked packed GEMM (gemm.emit_gemm_blocked), which 256-bit and narrower
vectors use for matmuls with a constant B and for GEMM convolutions, against torch:
K in one, two and several blocks, row counts that leave a partial row block and span
several row groups, N ragged against the panel width, fused epilogues (bias,
activation, residual), a runtime row count, grouped and transposed convolutions.
Compiled for AVX2 (256-bit) and for the x86-64 baseline (128-bit, no FMA), so the
path runs here whatever vector width this host would pick for itself."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil
from cuvil.backend.llvm.gemm import (L1_PANEL_BYTES, blocked_gemm, l1_k_blocks, micro_shape, panel_width,
                                     row_blocks)
from cuvil.backend.llvm.target import Target, host_target

X86 = "x86_64-unknown-linux-gnu"
HOST = host_target()
AVX2 = Target(X86, "haswell", "+avx,+avx2,+fma,+f16c")
BASELINE = Target.from_triple(X86)
TARGETS = [
    pytest.param(AVX2, id="avx2", marks=pytest.mark.skipif(
        not (HOST.arch == "x86_64" and HOST.has_feature("avx2") and HOST.has_feature("fma")),
        reason="this host cannot run AVX2 + FMA code")),
    pytest.param(BASELINE, id="x86-64-baseline", marks=pytest.mark.skipif(
        HOST.arch != "x86_64", reason="not an x86_64 host")),
]
REL_TOL = 2e-5  # of the output's largest magnitude: f32 sums of up to ~1500 products


def _randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _check(model, xs, target, jit=True, **options):
    model = model.eval()
    with torch.no_grad():
        ref = model(*xs).numpy()
    got = cuvil.compile(model, xs, target=target, jit=jit, **options)(*[x.numpy() for x in xs])[0]
    assert got.shape == ref.shape
    err = float(np.abs(got - ref).max()) / float(np.abs(ref).max())
    assert err <= REL_TOL, err
    return got


def test_the_blocking_covers_k_in_equal_slices_that_fit_l1():
    for vw in (4, 8):
        for k in (1, 15, 16, 255, 256, 257, 700, 4608):
            count, length = l1_k_blocks(k, vw)
            assert count * length >= k > (count - 1) * length
            assert length * panel_width(vw) * 4 <= max(L1_PANEL_BYTES, 16 * panel_width(vw) * 4)


def test_which_gemms_run_blocked():
    mr8 = micro_shape(8)[0]
    assert blocked_gemm(128, 768, 8) and blocked_gemm(128, 768, 4)
    assert not blocked_gemm(128, 768, 16)  # AVX-512 keeps the (panel, row block) items
    assert not blocked_gemm(1, 768, 8)     # a GEMV: no B panel is used twice
    assert not blocked_gemm(2 * mr8 - 1, 768, 8)
    assert not blocked_gemm(128, 2 * panel_width(8) - 1, 8)  # fewer than two full panels
    assert row_blocks(13, 8) == 3


class _Mlp(nn.Module):
    """Linear layers with K of 40 (one block), 700 (three) and 1100 (four or five), N
    ragged (37, 100) and whole (64, 1100) panels, bias + GELU / ReLU epilogues and a
    residual add."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(40, 700)
        self.b = nn.Linear(700, 1100)
        self.c = nn.Linear(1100, 100)
        self.d = nn.Linear(100, 100, bias=False)
        self.e = nn.Linear(100, 37)
        self.f = nn.Linear(37, 64)

    def forward(self, x):
        y = F.gelu(self.b(torch.relu(self.a(x))))
        y = self.c(y)
        y = y + self.d(y)
        return self.f(torch.tanh(self.e(y)))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rows", [13, 128, 301])
def test_linear_layers_match_torch(target, rows):
    """13 rows: two whole row blocks and a partial one; 301: several row groups."""
    _check(_Mlp(), (_randn(rows, rows, 40),), target)


@pytest.mark.parametrize("target", TARGETS)
def test_a_runtime_row_count_matches_torch(target):
    model = _Mlp().eval()
    cm = cuvil.compile(model, (_randn(0, 2, 9, 40),), target=target, jit=True,
                       dynamic_shapes=[("b", "s", 40)], dim_bounds={"b": (1, 3), "s": (1, 200)})
    for b, s in [(1, 1), (1, 5), (2, 6), (3, 7), (1, 12), (2, 97), (3, 200)]:
        x = _randn(b * s, b, s, 40)
        with torch.no_grad():
            ref = model(x).numpy()
        got = cm(x.numpy())[0]
        assert got.shape == ref.shape
        assert float(np.abs(got - ref).max()) <= REL_TOL * float(np.abs(ref).max()), (b, s)


class _Convs(nn.Module):
    """GEMM convs with >= 16 output panels (each packed, then multiplied K-blocked): K
    of 180 and 576, output planes ragged against the panel (18 x 18 = 324), a grouped
    conv, a residual add; then a 7 x 7 conv over 128 channels (K = 1152), which runs
    transposed (channels in the vector lanes), also K-blocked."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = nn.Conv2d(20, 64, 3, padding=1)
        self.c2 = nn.Conv2d(64, 30, 3)
        self.c3 = nn.Conv2d(30, 30, 1, bias=False)
        self.c4 = nn.Conv2d(30, 48, 3, padding=1, groups=2)
        self.c5 = nn.Conv2d(48, 128, 3, stride=2, padding=1)
        self.c6 = nn.Conv2d(128, 128, 3, stride=2, padding=1)
        self.c7 = nn.Conv2d(128, 40, 3, padding=1)

    def forward(self, x):
        y = self.c2(torch.relu(self.c1(x)))
        y = torch.relu(y + self.c3(y))
        y = torch.relu(self.c5(torch.relu(self.c4(y))))
        return self.c7(torch.relu(self.c6(y)))


@pytest.mark.parametrize("target", TARGETS)
def test_convolutions_match_torch(target):
    _check(_Convs(), (_randn(7, 1, 20, 20, 20),), target)


@pytest.mark.parametrize("target", TARGETS)
def test_threads_split_the_panels(target):
    """Two threads (the shared library's thread pool): each takes a range of panels
    (matmul) or of output panels (conv); the sums are the same as on one thread."""
    x = _randn(3, 1, 20, 20, 20)
    one = _check(_Convs(), (x,), target, jit=False)
    assert np.array_equal(one, _check(_Convs(), (x,), target, jit=False, threads=2))
    m = _randn(4, 128, 40)
    assert np.array_equal(_check(_Mlp(), (m,), target, jit=False),
                          _check(_Mlp(), (m,), target, jit=False, threads=2))
