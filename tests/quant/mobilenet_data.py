"""The real photos of examples/photos, pre-processed for MobileNetV2 (torchvision style),
and the calibration subset (the centre crop of each photo) shared with onnxruntime."""
from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PHOTOS = ROOT / "examples" / "photos"


def photo_paths() -> list[Path]:
    return sorted(PHOTOS.glob("*.jpg"))


def preprocess(path: Path) -> np.ndarray:
    from tests.cli.test_build import _torchvision_style
    return _torchvision_style(path)[0]


def images() -> np.ndarray:
    """[N, 3, 224, 224] f32, every photo in name order."""
    return np.stack([preprocess(p) for p in photo_paths()])


def calibration_indices() -> list[int]:
    return [i for i, p in enumerate(photo_paths()) if p.stem.endswith("_centre")]


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
