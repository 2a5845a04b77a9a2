"""F.grid_sample against torch: 4-D and 5-D inputs, bilinear, nearest and bicubic, zeros, border
and reflection padding, with and without align_corners, grids reaching past the
edges. In the interpreter and natively."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from tests.ops.checks import check_torch, seeded


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_2d(mode, padding, align):
    grid = seeded(2, 2, 5, 7, 2) * 0.8   # some points beyond [-1, 1]
    check_torch(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align),
                seeded(1, 2, 3, 6, 5), grid, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode, padding", [("bilinear", "zeros"), ("nearest", "reflection")])
def test_grid_sample_3d(mode, padding):
    grid = seeded(4, 1, 3, 4, 5, 3) * 0.8
    check_torch(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=False),
                seeded(3, 1, 2, 4, 5, 6), grid, atol=1e-5, rtol=1e-5)


def test_exact_pixel_centres():
    """align_corners=True with grid points on pixel centres reproduces the input."""
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, 4), torch.linspace(-1, 1, 5), indexing="ij")
    grid = torch.stack([xs, ys], -1)[None]
    check_torch(lambda x, g: F.grid_sample(x, g, align_corners=True), seeded(5, 1, 2, 4, 5), grid,
                atol=1e-6, rtol=1e-6)
