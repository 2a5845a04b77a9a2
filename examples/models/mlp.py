"""A 784-512-512-10 multi-layer perceptron with ReLU (MNIST-sized)."""

from __future__ import annotations

import torch
from torch import nn


def mlp(in_features: int = 784, hidden: int = 512, num_classes: int = 10) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


def example_inputs(seed: int = 0, batch: int = 1, in_features: int = 784) -> tuple[torch.Tensor]:
    """A seeded ``[batch, in_features]`` float32 batch."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(batch, in_features, generator=gen),)


def cuvil_entry() -> tuple[nn.Sequential, tuple[torch.Tensor]]:
    """Entry point for `cuvil build` configs: the MLP, random weights (seed 0), batch 1."""
    torch.manual_seed(0)
    return mlp().eval(), example_inputs()
