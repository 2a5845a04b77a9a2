"""A tiny 16-32-4 perceptron for the remote cache / execution tests, with its weights
in a file next to it (tiny_weights.npz, a declared input of the capture), so that a
test can edit the weights and watch which actions miss the cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

WEIGHTS = Path(__file__).with_name("tiny_weights.npz")


def tiny(weights: Path = WEIGHTS) -> nn.Sequential:
    w = np.load(weights)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    with torch.no_grad():
        for layer, name in ((model[0], "fc1"), (model[2], "fc2")):
            layer.weight.copy_(torch.from_numpy(w[f"{name}_weight"]))
            layer.bias.copy_(torch.from_numpy(w[f"{name}_bias"]))
    return model.eval()


def cuvil_entry() -> tuple[nn.Sequential, tuple[torch.Tensor]]:
    """Entry point of tiny.yaml: the model and a fixed [1, 16] input."""
    return tiny(), (torch.linspace(-1.0, 1.0, 16).reshape(1, 16),)


def write_weights(path: Path, seed: int = 0) -> None:
    """The committed tiny_weights.npz: `python cuvil_tiny_model.py` rewrites it."""
    rng = np.random.default_rng(seed)
    np.savez(path,
             fc1_weight=rng.standard_normal((32, 16), np.float32) * np.float32(0.25),
             fc1_bias=rng.standard_normal(32, np.float32) * np.float32(0.1),
             fc2_weight=rng.standard_normal((4, 32), np.float32) * np.float32(0.25),
             fc2_bias=rng.standard_normal(4, np.float32) * np.float32(0.1))


if __name__ == "__main__":
    write_weights(WEIGHTS)
