"""The model of the plugin examples: a tiny single-shot detector whose activation is a
custom op the compiler cannot lower.

`squareplus(x, b) = (x + sqrt(x*x + b)) / 2` is registered as the torch custom op
`cuvil_examples::squareplus`, so `torch.export` keeps it as one node; the build config
maps it to the C function `cuvil_squareplus` of squareplus.c. The detector maps a
[1, 3, 32, 32] image to [1, 64, 4 + 3]: per 4x4-pixel cell a box (cx, cy, w, h in
[0, 1], centred in
its cell) and 3 class probabilities, which detections.c turns into JSON.
"""
from __future__ import annotations

import torch
from torch import nn

CLASSES = ["cat", "dog", "bird"]


@torch.library.custom_op("cuvil_examples::squareplus", mutates_args=())
def squareplus(x: torch.Tensor, b: float) -> torch.Tensor:
    return 0.5 * (x + torch.sqrt(x * x + b))


@squareplus.register_fake
def _(x, b):
    return torch.empty_like(x)


class Squareplus(nn.Module):
    def __init__(self, b: float = 4.0):
        super().__init__()
        self.b = b

    def forward(self, x):
        return squareplus(x, self.b)


class TinyDetector(nn.Module):
    def __init__(self, classes: int = len(CLASSES)):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), Squareplus(4.0),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), Squareplus(1.0))
        self.head = nn.Conv2d(16, 4 + classes, 1)
        ys, xs = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
        self.register_buffer("grid", torch.stack([xs, ys], -1).reshape(64, 2))  # cell (x, y), row-major

    def forward(self, image):
        y = self.head(self.features(image))              # [1, 4 + K, 8, 8]
        y = y.flatten(2).transpose(1, 2)                 # [1, 64, 4 + K]
        t = torch.sigmoid(y[..., :4])
        centre = (self.grid + t[..., :2]) / 8.0          # inside its cell
        size = t[..., 2:4] * 0.5
        scores = torch.softmax(y[..., 4:], dim=-1)
        return torch.cat([centre, size, scores], dim=-1)


def cuvil_entry():
    torch.manual_seed(0)
    model = TinyDetector().eval()
    with torch.no_grad():
        model.head.weight.mul_(3.0)  # confident enough that some cells pass a 0.5 threshold
    return model, (torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)
