"""The depthwise convolution kernel (kernels.k_conv2d_depthwise) against torch: window
sizes 1 to 7, strides 1 to 3, dilation, symmetric and uneven padding, channel
multipliers 1 and 2, planes from smaller than the window to wider than several
register blocks (so the vector blocks, the narrower vectors and the scalar border
columns all run), fused epilogues (bias, ReLU6, residual); for this host's vector width
and for 256- and 128-bit targets (the masked kernel, k_conv2d_depthwise_masked, runs
with 256- and 512-bit vectors, the row kernel with narrower ones); and one model through the shared library on two
threads. Also: the kernel is the one these convs use, and border taps read only the
input they cover (an inf outside a window stays out of its output)."""
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
X86 = "x86_64-unknown-linux-gnu"
HOST = host_target()
NARROW = [
    pytest.param(Target(X86, "haswell", "+avx,+avx2,+fma,+f16c"), id="avx2", marks=pytest.mark.skipif(
        not (HOST.arch == "x86_64" and HOST.has_feature("avx2") and HOST.has_feature("fma")),
        reason="this host cannot run AVX2 + FMA code")),
    pytest.param(Target.from_triple(X86), id="x86-64-baseline", marks=pytest.mark.skipif(
        HOST.arch != "x86_64", reason="not an x86_64 host")),
]


def dw(c, k, mult=1, seed=0, **kw) -> nn.Conv2d:
    torch.manual_seed(seed)
    return nn.Conv2d(c, c * mult, k, groups=c, **kw)


CASES = [
    (dw(3, 3, padding=1), (2, 3, 5, 5)),                            # the window covers most of the plane
    (dw(4, 3, padding=1), (1, 4, 56, 61)),                          # blocks, narrower vectors, borders
    (dw(4, 3, stride=2, padding=1), (1, 4, 57, 112)),               # strided loads
    (dw(2, 3, stride=3, padding=2, bias=False), (1, 2, 40, 77)),
    (dw(3, 5, padding=2), (1, 3, 29, 45)),
    (dw(2, 7, padding=3), (1, 2, 20, 70)),
    (dw(3, 3, padding=(0, 2)), (1, 3, 13, 38)),                     # padding differs per axis
    (dw(2, (3, 5), stride=(1, 2), padding=(1, 2)), (1, 2, 17, 90)),
    (dw(3, 3, dilation=2, padding=2), (1, 3, 21, 50)),
    (dw(3, 3, mult=2, padding=1), (2, 3, 15, 40)),                  # channel multiplier 2
    (dw(5, 1), (1, 5, 9, 33)),                                      # 1x1 depthwise: a per-channel scale
    (dw(2, 3), (1, 2, 3, 3)),                                       # one output, no padding
    (dw(2, 5, padding=1), (1, 2, 4, 40)),                           # window taller than the plane
]


@pytest.mark.parametrize("module, shape", CASES)
def test_depthwise_matches_torch(module, shape):
    check_torch(module, seeded(1, *shape), atol=ATOL, rtol=RTOL)


class Block(nn.Module):
    """Depthwise + bias + ReLU6 + residual (the epilogue fused into each output row)."""

    def __init__(self, c=6, stride=1):
        super().__init__()
        self.conv = dw(c, 3, padding=1, stride=stride)

    def forward(self, x, r):
        return F.relu6(self.conv(x)) + r


@pytest.mark.parametrize("hw", [(7, 7), (28, 28), (19, 45)])
def test_depthwise_epilogue(hw):
    check_torch(Block(), seeded(2, 2, 6, *hw), seeded(3, 2, 6, *hw), atol=ATOL, rtol=RTOL)


class BiasRelu6(nn.Module):
    """Depthwise + bias + ReLU6 without a residual: an epilogue of one value per plane,
    which the masked kernel applies in registers before the store."""

    def __init__(self, c, stride):
        super().__init__()
        self.conv = dw(c, 3, padding=1, stride=stride, seed=3)

    def forward(self, x):
        return F.relu6(self.conv(x) * 2.0)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("hw", [(7, 7), (14, 14), (50, 35)])
def test_depthwise_bias_relu6(hw, stride):
    check_torch(BiasRelu6(8, stride), seeded(12, 1, 8, *hw), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("target", NARROW)
@pytest.mark.parametrize("case", [1, 2, 3, 9])
def test_depthwise_on_narrower_vectors(target, case):
    module, shape = CASES[case]
    x = seeded(4, *shape)
    with torch.no_grad():
        ref = module.eval()(x).numpy()
    got = cuvil.compile(module, (x,), target=target, jit=True)(x.numpy())[0]
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)


def test_the_depthwise_kernel_runs(monkeypatch):
    """The conv runs one depthwise kernel: the masked one where the host has 256- or
    512-bit vectors, the row kernel otherwise."""
    calls = []
    for name in ("k_conv2d_depthwise", "k_conv2d_depthwise_masked"):
        form = name[len("k_conv2d_"):]  # the emitter of the plan's form

        def counting(b, k, real=getattr(kernels, name), name=name):
            calls.append((name, k.in_types[1].shape))
            return real(b, k)
        monkeypatch.setitem(kernels.OTHER_FORMS, form, counting)
    check_torch(Block(stride=2), seeded(5, 1, 6, 20, 20), seeded(6, 1, 6, 10, 10), atol=ATOL, rtol=RTOL)
    wide = HOST.vector_bits >= 256
    assert calls == [("k_conv2d_depthwise_masked" if wide else "k_conv2d_depthwise", (6, 1, 3, 3))]


@pytest.mark.parametrize("width", [7, 15, 31])
def test_stores_stay_inside_the_output(width):
    """Output rows one column short of whole 8 / 16 / 32-lane vectors: the last store of
    every row is masked, so nothing lands past the output's end."""
    module, x = BiasRelu6(4, 1).eval(), seeded(13, 1, 4, 6, width)
    got = run_guarded(cuvil.compile(module, (x,)), x.numpy())[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, module(x).numpy(), atol=ATOL, rtol=RTOL)


def test_border_taps_read_only_their_window():
    """An inf in the first column of the input: only outputs whose window covers it may
    be inf or nan; the others equal torch's finite values."""
    module = dw(2, 3, padding=1).eval()
    x = seeded(7, 1, 2, 12, 40)
    x[0, :, 5, 0] = float("inf")
    with torch.no_grad():
        ref = module(x).numpy()
    got = cuvil.compile(module, (x,))(x.numpy())[0]
    finite = np.isfinite(ref)
    assert not finite.all() and finite.sum() > 0.9 * finite.size
    np.testing.assert_allclose(got[finite], ref[finite], atol=ATOL, rtol=RTOL)
    assert not np.isfinite(got[~finite]).any()


def test_depthwise_threads_match_one_thread():
    module = Block(c=16)
    x, r = seeded(8, 2, 16, 30, 30), seeded(9, 2, 16, 30, 30)
    one = cuvil.compile(module, (x, r), threads=1)(x.numpy(), r.numpy())[0]
    two = cuvil.compile(module, (x, r), threads=2)(x.numpy(), r.numpy())[0]
    assert np.array_equal(one, two)
    with torch.no_grad():
        np.testing.assert_allclose(two, module(x, r).numpy(), atol=ATOL, rtol=RTOL)
