"""Max, average and adaptive-average pooling against torch, with hypothesis over the
geometry: kernel, stride, padding, dilation, ceil_mode, count_include_pad."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from tests.ops.checks import check_torch, seeded

ATOL, RTOL = 1e-6, 1e-5


@pytest.mark.parametrize("module, shape", [
    (nn.MaxPool2d(2), (1, 3, 8, 8)),
    (nn.MaxPool2d(3, stride=2, padding=1), (2, 3, 9, 10)),            # ResNet stem
    (nn.MaxPool2d(3, stride=2, ceil_mode=True), (1, 2, 8, 8)),
    (nn.MaxPool2d((2, 3), stride=(1, 2), padding=(1, 1)), (1, 2, 5, 7)),
    (nn.MaxPool2d(3, stride=1, padding=1, dilation=2), (1, 2, 7, 7)),
    (nn.AvgPool2d(2), (1, 3, 8, 8)),
    (nn.AvgPool2d(3, stride=2, padding=1), (1, 3, 7, 7)),
    (nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), (1, 3, 7, 7)),
    (nn.AvgPool2d(3, stride=2, ceil_mode=True), (1, 2, 8, 8)),
    (nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), (1, 2, 8, 8)),
    (nn.AvgPool2d(2, divisor_override=3), (1, 2, 6, 6)),
    (nn.MaxPool2d(3, stride=3, ceil_mode=True), (1, 2, 2, 2)),        # window larger than the input
    (nn.AvgPool2d(2, stride=2, ceil_mode=True), (1, 2, 1, 3)),
    (nn.AdaptiveAvgPool2d(1), (2, 4, 7, 5)),
    (nn.AdaptiveAvgPool2d(1), (1, 1280, 7, 7)),                        # global: planes split across threads
    (nn.AdaptiveAvgPool2d(1), (1, 3, 2, 3)),                           # planes narrower than a vector
    (nn.AdaptiveAvgPool2d((3, 2)), (1, 2, 7, 5)),                      # uneven, overlapping windows
    (nn.AdaptiveAvgPool2d((4, 6)), (1, 2, 4, 3)),                      # output larger than input
    (nn.AdaptiveAvgPool2d((None, 2)), (1, 2, 5, 6)),
    (nn.AdaptiveAvgPool1d(3), (2, 3, 7)),
])
def test_pool(module, shape):
    check_torch(module, seeded(1, *shape), atol=ATOL, rtol=RTOL)


def test_max_pool_all_negative_window_with_padding():
    """Padding must act as -inf for max pooling, not 0."""
    x = -seeded(2, 1, 2, 4, 4, low=1.0, high=2.0)
    check_torch(nn.MaxPool2d(3, stride=2, padding=1), x, atol=0, rtol=0)


@st.composite
def pool_geometry(draw, max_pool: bool):
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pad = tuple(draw(st.integers(0, k[i] // 2)) for i in (0, 1))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if max_pool else (1, 1)
    hw = [max(1, (k[i] - 1) * dil[i] + 1 - 2 * pad[i]) + draw(st.integers(0, 5)) for i in (0, 1)]
    return dict(kernel_size=k, stride=stride, padding=pad, ceil_mode=draw(st.booleans()),
                **({"dilation": dil} if max_pool else {"count_include_pad": draw(st.booleans())})), hw


@given(pool_geometry(max_pool=True), st.integers(0, 2 ** 16))
def test_max_pool_geometry(geometry, seed):
    kw, hw = geometry
    check_torch(lambda x: F.max_pool2d(x, **kw), seeded(seed, 1, 2, *hw), atol=0, rtol=0, name=f"max_pool2d {kw}")


@given(pool_geometry(max_pool=False), st.integers(0, 2 ** 16))
def test_avg_pool_geometry(geometry, seed):
    kw, hw = geometry
    check_torch(lambda x: F.avg_pool2d(x, **kw), seeded(seed, 1, 2, *hw), atol=ATOL, rtol=RTOL,
                name=f"avg_pool2d {kw}")


@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 6), st.integers(1, 6))
def test_adaptive_avg_pool_sizes(h, w, oh, ow):
    check_torch(lambda x: F.adaptive_avg_pool2d(x, (oh, ow)), seeded(h * w, 1, 2, h, w), atol=ATOL, rtol=RTOL)
