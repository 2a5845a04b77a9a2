"""F.interpolate in 1-D, 2-D and 3-D against torch: nearest, nearest-exact, linear,
bilinear, bicubic and trilinear, by size and by scale factor, with and without
align_corners, up and down. In the interpreter and natively."""
from __future__ import annotations

import pytest
from torch.nn import functional as F

from tests.ops.checks import check_torch, seeded


@pytest.mark.parametrize("shape, kwargs", [
    ((2, 3, 7), dict(size=12, mode="nearest")),
    ((2, 3, 7), dict(scale_factor=1.7, mode="nearest-exact")),
    ((2, 3, 7), dict(size=4, mode="linear")),
    ((2, 3, 7), dict(scale_factor=2.5, mode="linear", align_corners=True)),
    ((1, 2, 5, 6), dict(size=(9, 4), mode="bicubic")),
    ((1, 2, 5, 6), dict(scale_factor=1.5, mode="bicubic", align_corners=True)),
    ((1, 2, 5, 6), dict(size=(3, 11), mode="nearest-exact")),
    ((1, 2, 3, 4, 5), dict(size=(5, 3, 7), mode="trilinear")),
    ((1, 2, 3, 4, 5), dict(scale_factor=2, mode="nearest")),
    ((1, 2, 3, 4, 5), dict(scale_factor=(1.5, 0.5, 2.0), mode="trilinear", align_corners=True)),
    ((1, 2, 3, 4, 5), dict(size=(4, 4, 4), mode="area")),
])
def test_interpolate(shape, kwargs):
    check_torch(lambda x: F.interpolate(x, **kwargs), seeded(1, *shape), atol=1e-5, rtol=1e-5)
