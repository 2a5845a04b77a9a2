"""Pooling over 1, 2 and 3 spatial dims against torch: batched and unbatched inputs,
max pooling's optional indices, ceil_mode, dilation, padding, adaptive pooling to sizes
that do not divide the input, and im2col (`F.unfold`)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.ops.checks import check_torch, op_names, seeded

ATOL, RTOL = 1e-6, 1e-5


@pytest.mark.parametrize("module, shape", [
    (nn.MaxPool1d(3), (2, 3, 10)),
    (nn.MaxPool1d(3, stride=2, padding=1, dilation=2, ceil_mode=True), (2, 3, 11)),
    (nn.MaxPool1d(2), (3, 9)),                                                     # unbatched
    (nn.MaxPool2d(3, stride=2, padding=1), (3, 9, 10)),                             # unbatched
    (nn.MaxPool3d(2), (1, 2, 4, 5, 6)),
    (nn.MaxPool3d((2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), dilation=(1, 1, 2)), (2, 2, 5, 6, 7)),
    (nn.MaxPool3d(3, stride=2, ceil_mode=True), (2, 5, 6, 7)),                      # unbatched, ceil
    (nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False), (2, 3, 10)),
    (nn.AvgPool1d(4, stride=3, ceil_mode=True), (3, 11)),                           # unbatched
    (nn.AvgPool2d(3, stride=2, padding=1), (3, 7, 8)),                              # unbatched
    (nn.AvgPool3d(2), (1, 2, 4, 6, 6)),
    (nn.AvgPool3d(3, stride=2, padding=1), (1, 2, 5, 6, 7)),
    (nn.AvgPool3d(3, stride=2, padding=1, count_include_pad=False), (1, 2, 5, 6, 7)),
    (nn.AvgPool3d((2, 3, 3), stride=2, ceil_mode=True), (2, 5, 6, 7)),             # unbatched, ceil
    (nn.AvgPool3d(2, divisor_override=3), (1, 2, 4, 4, 4)),
    (nn.AdaptiveAvgPool1d(4), (3, 10)),                                             # unbatched
    (nn.AdaptiveAvgPool2d((3, 2)), (2, 7, 5)),                                      # unbatched
    (nn.AdaptiveAvgPool3d((2, 3, 1)), (1, 2, 4, 7, 5)),                             # uneven windows
    (nn.AdaptiveAvgPool3d(2), (2, 4, 6, 8)),                                        # unbatched
    (nn.AdaptiveMaxPool1d(3), (2, 3, 7)),
    (nn.AdaptiveMaxPool2d((3, 2)), (1, 2, 7, 5)),                                   # uneven windows
    (nn.AdaptiveMaxPool2d(2), (3, 6, 6)),                                           # unbatched
    (nn.AdaptiveMaxPool3d((2, 1, 3)), (1, 2, 5, 4, 6)),
])
def test_pool_family(module, shape):
    check_torch(module, seeded(1, *shape), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("module, shape", [
    (nn.MaxPool1d(3, stride=2, padding=1, return_indices=True), (2, 3, 10)),
    (nn.MaxPool1d(2, return_indices=True), (3, 9)),                                 # unbatched
    (nn.MaxPool2d(3, stride=2, padding=1, return_indices=True), (2, 3, 9, 10)),
    (nn.MaxPool2d((2, 3), dilation=(2, 1), ceil_mode=True, return_indices=True), (3, 7, 8)),
    (nn.MaxPool3d(2, return_indices=True), (1, 2, 4, 5, 6)),
    (nn.MaxPool3d(3, stride=2, padding=1, return_indices=True), (2, 5, 6, 7)),     # unbatched
    (nn.AdaptiveMaxPool1d(3, return_indices=True), (2, 3, 7)),
    (nn.AdaptiveMaxPool2d((3, 2), return_indices=True), (1, 2, 7, 5)),
    (nn.AdaptiveMaxPool2d(2, return_indices=True), (3, 6, 6)),                      # uniform windows
    (nn.AdaptiveMaxPool3d((2, 1, 3), return_indices=True), (2, 5, 4, 6)),
])
def test_max_pool_indices(module, shape):
    """Both outputs: the values and the flat index (over the spatial dims) of each max."""
    check_torch(module, seeded(2, *shape), atol=0, rtol=0)


def test_max_pool_indices_of_ties_and_nans():
    """Ties keep the first index in scan order; a NaN wins its window, as in torch."""
    x = torch.tensor([[[1.0, 1.0, 3.0, 3.0, float("nan"), 2.0, -1.0, -1.0]]])
    check_torch(nn.MaxPool1d(2, stride=1, return_indices=True), x, atol=0, rtol=0)
    check_torch(nn.MaxPool1d(3, stride=1, padding=1, return_indices=True), x, atol=0, rtol=0)


def test_only_values_of_indexed_pool_used():
    """An unused indices output lowers to the pooling kernel alone."""
    module = check_torch(lambda x: F.max_pool2d_with_indices(x, 3, 2, 1)[0] * 2.0, seeded(3, 1, 2, 9, 9),
                         atol=ATOL, rtol=RTOL)
    names = op_names(module)
    assert "cuvil.max_pool2d" in names and "cuvil.where" not in names


@pytest.mark.parametrize("kwargs, shape", [
    (dict(kernel_size=2), (2, 3, 5, 6)),
    (dict(kernel_size=(2, 3), dilation=(1, 2), padding=1, stride=(2, 1)), (1, 2, 6, 7)),
    (dict(kernel_size=3, padding=1), (2, 5, 5)),                                    # unbatched
])
def test_unfold(kwargs, shape):
    check_torch(lambda x: F.unfold(x, **kwargs), seeded(4, *shape), atol=0, rtol=0)
