"""The Winograd F(2x2, 3x3) convolution (kernels.k_conv2d_winograd) against torch: odd
and even plane sizes (ragged last tile row and column, several vectors of tiles per
row), padding 0 / 1 / 2 and uneven, channel counts that are not multiples of the
vector width, batch 2, fused epilogues (bias + ReLU in registers, a residual on each
stored row pair), two threads against one, in both forms (step by step over whole
planes, and tile row by tile row for small weights), for this host's vector width and
for an AVX2 target; and which convs take it (3x3, stride and dilation 1, enough channels and
tiles, 256- or 512-bit vectors)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import cuvil
from cuvil.backend.llvm.kernels import conv as kernels, winograd
from cuvil.backend.llvm.target import Target, host_target
from tests.ops.checks import check_torch, run_guarded, seeded

ATOL, RTOL = 1e-5, 1e-4
HOST = host_target()
WIDE = HOST.vector_bits >= 256
AVX2 = pytest.mark.skipif(not (HOST.arch == "x86_64" and HOST.has_feature("avx2") and HOST.has_feature("fma")),
                          reason="this host cannot run AVX2 + FMA code")


def conv(cin, cout, seed=0, **kw) -> nn.Conv2d:
    torch.manual_seed(seed)
    return nn.Conv2d(cin, cout, 3, **kw)


CASES = [
    (conv(16, 16, padding=1), (1, 16, 12, 12)),
    (conv(24, 40, padding=1), (1, 24, 15, 17)),       # odd: the last tile row and column are half
    (conv(16, 20, padding=0), (2, 16, 19, 9)),        # no padding, batch 2
    (conv(17, 33, padding=2), (1, 17, 11, 13)),       # padding 2: output larger than the input
    (conv(32, 16, padding=(1, 0)), (1, 32, 13, 70)),  # uneven padding; 35 tiles per row: 3 vectors
    (conv(64, 64, padding=1), (1, 64, 56, 56)),       # ResNet-50's first stage
]


@pytest.mark.parametrize("module, shape", CASES)
def test_winograd_matches_torch(module, shape):
    check_torch(module, seeded(1, *shape), atol=ATOL, rtol=RTOL)


def test_the_cases_cover_both_forms():
    forms = {winograd.winograd_blocked(m.in_channels, m.out_channels,
                                       cuvil.ir.TensorType((1, m.out_channels, *m(seeded(0, *s)).shape[2:]), "f32"))
             for m, s in CASES}
    assert forms == {True, False}


@AVX2
@pytest.mark.parametrize("case", [1, 3, 4])
def test_winograd_on_avx2(case):
    module, shape = CASES[case]
    x = seeded(6, *shape)
    with torch.no_grad():
        ref = module.eval()(x).numpy()
    target = Target("x86_64-unknown-linux-gnu", "haswell", "+avx,+avx2,+fma,+f16c")
    got = cuvil.compile(module, (x,), target=target, jit=True)(x.numpy())[0]
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)


class Block(nn.Module):
    def __init__(self, c=24, residual=False):
        super().__init__()
        self.conv = conv(c, c, seed=3, padding=1)
        self.residual = residual

    def forward(self, x):
        y = self.conv(x)
        return F.relu(y + x if self.residual else y)


@pytest.mark.parametrize("residual", [False, True], ids=["bias-relu", "residual-relu"])
@pytest.mark.parametrize("hw", [(14, 14), (21, 16)])
def test_winograd_epilogues(residual, hw):
    check_torch(Block(residual=residual), seeded(2, 1, 24, *hw), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("width", [15, 31, 63])
def test_stores_stay_inside_the_output(width):
    """Output rows one column short of whole 16 / 32 / 64-lane stores: the last store of
    every row is masked, so nothing lands past the output's end."""
    module, x = Block(c=16).eval(), seeded(7, 1, 16, 9, width)
    got = run_guarded(cuvil.compile(module, (x,)), x.numpy())[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, module(x).numpy(), atol=ATOL, rtol=RTOL)


def test_two_threads_match_one():
    module, x = Block(c=32, residual=True).eval(), seeded(4, 1, 32, 23, 18)
    one = cuvil.compile(module, (x,), threads=1)(x.numpy())[0]
    two = cuvil.compile(module, (x,), threads=2)(x.numpy())[0]
    assert np.array_equal(one, two)


def test_which_convs_run_winograd(monkeypatch):
    calls = []
    real = kernels.k_conv2d_winograd

    def counting(b, k):
        calls.append(tuple(k.in_types[1].shape))
        return real(b, k)
    monkeypatch.setitem(kernels.OTHER_FORMS, "winograd", counting)  # the emitter of the plan's form

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = conv(16, 16, padding=1)             # yes
            self.b = conv(16, 16, padding=1, stride=2)   # stride 2: no
            self.c = conv(16, 8, padding=1)              # 8 output channels: no
            self.d = conv(8, 16, padding=1)              # 8 input channels: no
            self.e = conv(16, 16, padding=1)             # a 7x7 plane: 16 tiles, no

        def forward(self, x):
            y = self.a(x)
            return self.d(self.c(y)).mean() + self.e(self.b(y)).mean()

    check_torch(Net(), seeded(5, 1, 16, 14, 14), atol=ATOL, rtol=RTOL)
    assert calls == ([(16, 16, 3, 3)] if WIDE else [])
