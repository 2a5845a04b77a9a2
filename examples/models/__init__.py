"""Pure-PyTorch example models (no torchvision).

Each module exposes a builder and ``example_inputs(seed=0)``. Builders leave
weights at their usual random initialisation; ``randomize_norm_stats_`` gives
batch-norm layers non-trivial statistics so that tests of batch-norm folding
cannot pass with an identity-like normalisation.
"""

from __future__ import annotations

import torch
from torch import nn


def randomize_norm_stats_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Fill every BatchNorm's affine parameters and running stats with seeded
    random values (in place) and return ``model``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                n = module.num_features
                module.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                module.running_var.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                if module.affine:
                    module.weight.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                    module.bias.copy_(torch.randn(n, generator=gen) * 0.1)
    return model


def image_batch(batch: int = 1, size: int = 224, seed: int = 0) -> tuple[torch.Tensor]:
    """A seeded NCHW float32 batch roughly like normalised ImageNet input."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 3, size, size, generator=gen),)
