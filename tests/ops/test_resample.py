"""Constant padding (incl. negative pads that crop) and upsampling (nearest, bilinear
with align_corners both ways) against torch; hypothesis over sizes and scale factors."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from tests.ops.checks import check_torch, seeded

EXACT = dict(atol=0, rtol=0)
ATOL, RTOL = 2e-6, 1e-5  # bilinear: torch computes source coordinates and lerps in float32


@pytest.mark.parametrize("fn", [
    lambda x: F.pad(x, (1, 2)), lambda x: F.pad(x, (1, 0, 0, 2)), lambda x: F.pad(x, (0, 0, 1, 1, 2, 0), value=-1.5),
    lambda x: F.pad(x, (1, 1, 1, 1, 1, 1, 1, 1), value=3.0), lambda x: F.pad(x, (-1, 2, 1, -2)),
    lambda x: F.pad(x, (-1, -1)), lambda x: F.pad(x, (0, 0)), nn.ZeroPad2d((1, 0, 2, 3)), nn.ConstantPad2d(2, 0.25),
])
def test_constant_pad(fn):
    check_torch(fn, seeded(1, 1, 2, 4, 5), **EXACT)


@pytest.mark.parametrize("fn", [
    nn.Upsample(scale_factor=2), nn.Upsample(scale_factor=2, mode="bilinear"),
    nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True), nn.UpsamplingNearest2d(scale_factor=3),
    nn.UpsamplingBilinear2d(scale_factor=2),  # align_corners=True
    lambda x: F.interpolate(x, size=(7, 3)), lambda x: F.interpolate(x, size=(2, 9), mode="bilinear"),
    lambda x: F.interpolate(x, scale_factor=(1.5, 0.5)), lambda x: F.interpolate(x, scale_factor=1.75, mode="bilinear"),
    lambda x: F.interpolate(x, size=(1, 1), mode="bilinear", align_corners=True),
    lambda x: F.interpolate(x, scale_factor=(1.1, 2.0), mode="bilinear"),  # H unchanged: torch copies rows
    lambda x: F.interpolate(x, scale_factor=(1.2, 1.2), mode="bilinear"),  # both unchanged
])
def test_upsample(fn):
    check_torch(fn, seeded(2, 2, 3, 4, 5), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("size, kw", [
    ((2, 22), dict(scale_factor=(1.1, 1.0))),    # output size = input size: torch copies rows
    ((10, 3), dict(scale_factor=(2.05, 1.0))),   # output size = 2 x input: torch halves the index
    ((26, 2), dict(size=(22, 2))),               # floor(i * 26/22) differs in float32 and float64
    ((30, 2), dict(size=(26, 2))),
])
def test_nearest_index_rounding(size, kw):
    x = seeded(3, 1, 1, *size)
    check_torch(lambda x: F.interpolate(x, mode="nearest", **kw), x, **EXACT)


SCALES = st.sampled_from([0.5, 0.75, 1.0, 1.25, 4 / 3, 1.5, 2.0, 2.5, 3.0])


@given(st.integers(2, 6), st.integers(2, 6), st.booleans(), st.data())
def test_nearest_sizes_and_scales(h, w, by_size, data):
    if by_size:
        kw = dict(size=(data.draw(st.integers(1, 12)), data.draw(st.integers(1, 12))))
    else:
        kw = dict(scale_factor=(data.draw(SCALES), data.draw(SCALES)))
    check_torch(lambda x: F.interpolate(x, mode="nearest", **kw), seeded(h * w, 1, 2, h, w), **EXACT,
                name=f"nearest {kw} from {h}x{w}")


@given(st.integers(2, 6), st.integers(2, 6), st.booleans(), st.booleans(), st.data())
def test_bilinear_sizes_and_scales(h, w, align_corners, by_size, data):
    if by_size:
        kw = dict(size=(data.draw(st.integers(1, 12)), data.draw(st.integers(1, 12))))
    else:
        kw = dict(scale_factor=(data.draw(SCALES), data.draw(SCALES)))
    check_torch(lambda x: F.interpolate(x, mode="bilinear", align_corners=align_corners, **kw),
                seeded(h * w, 1, 2, h, w), atol=ATOL, rtol=RTOL,
                name=f"bilinear align_corners={align_corners} {kw} from {h}x{w}")
