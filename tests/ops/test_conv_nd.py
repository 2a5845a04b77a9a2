"""conv3d (one conv2d per kernel depth) and transposed convolutions with computed
weights, unbatched inputs and padding past dilation*(k-1), against torch. In the
interpreter and natively."""
from __future__ import annotations

import pytest
from torch import nn
from torch.nn import functional as F

from tests.ops.checks import check_torch, seeded

TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("module, shape", [
    (nn.Conv3d(3, 4, 3), (2, 3, 5, 6, 7)),
    (nn.Conv3d(4, 6, (2, 3, 1), stride=(2, 1, 2), padding=(1, 1, 0), dilation=(2, 1, 1), groups=2), (1, 4, 7, 5, 6)),
    (nn.Conv3d(2, 3, 3, padding="same", bias=False), (1, 2, 4, 5, 5)),
    (nn.Conv3d(2, 3, 2), (2, 4, 5, 3)),                                                # unbatched
    (nn.ConvTranspose2d(3, 4, 3, stride=2, padding=2, output_padding=1), (1, 3, 5, 6)),  # padding > k-1
    (nn.ConvTranspose2d(4, 2, 2, stride=2, groups=2), (4, 3, 3)),                      # unbatched
    (nn.ConvTranspose1d(3, 2, 3, stride=3, padding=3), (2, 3, 7)),
])
def test_conv(module, shape):
    check_torch(module, seeded(1, *shape), **TOL)


def test_transposed_conv_with_computed_weight():
    check_torch(lambda x, w: F.conv_transpose2d(x, w * 2, stride=2, padding=1), seeded(2, 1, 3, 4, 5),
                seeded(3, 3, 2, 3, 3), **TOL)
    check_torch(lambda x, w: F.conv_transpose1d(x, w.relu(), groups=3), seeded(4, 2, 3, 6), seeded(5, 3, 1, 4),
                **TOL)


def test_symbolic_spatial_dims_are_a_clean_error():
    """Symbolic height/width: an UnsupportedOpError naming the op, not a TypeError."""
    import torch
    from cuvil.errors import UnsupportedOpError
    from cuvil.frontends.torch import capture_torch
    for model in (nn.Conv2d(3, 4, 3), nn.MaxPool2d(2)):
        with pytest.raises(UnsupportedOpError, match=r"symbolic spatial dims \['h', 'w'\]"):
            capture_torch(model, [torch.ones(1, 3, 16, 16)], dynamic_shapes=[(None, None, "h", "w")],
                          dim_bounds={"h": (8, 32), "w": (8, 32)})
