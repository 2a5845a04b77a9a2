"""reflect / replicate / circular padding (and negative pads), vector norms of every
order, rms_norm, native_layer_norm's mean and rstd, pixel_shuffle/unshuffle, meshgrid,
unbatched conv1d/conv2d and index_select of a 0-d tensor, against torch. In the
interpreter and natively."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.ops.checks import check_torch, seeded

X = seeded(1, 2, 3, 5, 6)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad", [(1, 2, 3, 0), (-1, 2, 1, -2), (0, 0, 4, 4)])
def test_pad_modes(mode, pad):
    if mode == "reflect" and max(pad) >= 5:
        pytest.skip("torch: reflect padding must be smaller than the dim")
    check_torch(lambda x: F.pad(x * 2, pad, mode=mode), X, atol=0, rtol=0)


def test_pad_modes_1d_and_3d():
    check_torch(lambda x: F.pad(x, (2, 3), mode="reflect"), seeded(2, 2, 7), atol=0, rtol=0)
    check_torch(lambda x: F.pad(x, (1, 1, 2, 0, 0, 1), mode="replicate"), seeded(3, 1, 2, 3, 4, 5), atol=0, rtol=0)


@pytest.mark.parametrize("ord_, dim", [(2, None), (1, 1), (float("inf"), (1, 2)), (-float("inf"), -1), (0, 0),
                                       (3.5, (2, 3)), (-1.5, None), (0.5, 1)])
def test_vector_norm(ord_, dim):
    check_torch(lambda x: torch.linalg.vector_norm(x, ord_, dim), X, atol=1e-5, rtol=1e-5)


def test_norms_of_zero_dim_and_fro():
    check_torch(lambda x: torch.linalg.vector_norm(x, 3), torch.tensor(-2.0), atol=1e-6, rtol=1e-6)
    check_torch(lambda x: torch.norm(x, "fro", dim=(1, 2)), X, atol=1e-5, rtol=1e-5)


def test_rms_and_native_layer_norm():
    w = seeded(4, 6)
    check_torch(lambda x: F.rms_norm(x, (6,), w, eps=1e-5), X, atol=1e-5, rtol=1e-5)
    check_torch(lambda x: F.rms_norm(x, (5, 6)), X, atol=1e-5, rtol=1e-5)
    check_torch(lambda x: torch.native_layer_norm(x, (5, 6), None, None, 1e-5), X, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn, shape", [
    (lambda x: F.pixel_shuffle(x, 2), (2, 8, 3, 4)), (lambda x: F.pixel_shuffle(x, 3), (9, 2, 2)),
    (lambda x: F.pixel_unshuffle(x, 2), (2, 3, 4, 6)), (lambda x: F.pixel_unshuffle(x, 2), (1, 2, 3, 4, 4)),
])
def test_pixel_shuffle(fn, shape):
    check_torch(fn, seeded(5, *shape), atol=0, rtol=0)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(indexing):
    check_torch(lambda a, b, c: torch.meshgrid(a * 2, b, c, indexing=indexing),
                seeded(6, 3), seeded(7, 4), torch.tensor(1.5), atol=0, rtol=0)


def test_unbatched_conv_and_index_select_of_0d():
    check_torch(nn.Conv2d(3, 4, 3, padding=1), seeded(8, 3, 6, 7), atol=1e-5, rtol=1e-5)
    check_torch(nn.Conv1d(3, 2, 2, stride=2), seeded(9, 3, 8), atol=1e-5, rtol=1e-5)
    check_torch(lambda x, i: torch.index_select(x, 0, i), torch.tensor(2.5), torch.tensor([0]), atol=0, rtol=0)
