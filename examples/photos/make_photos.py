"""Regenerates the 224x224 JPEG crops in this directory from photos shipped inside
installed wheels (scikit-image's data directory and matplotlib's sample data): 13
crops per photo (see `crops`), resized with Pillow's LANCZOS filter, some mirrored, saved
at JPEG quality 85.

    python examples/photos/make_photos.py
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import skimage
from PIL import Image

HERE = Path(__file__).resolve().parent
SKIMAGE = Path(skimage.__file__).parent / "data"
MPL = Path(matplotlib.get_data_path()) / "sample_data"
SOURCES = [SKIMAGE / n for n in (
    "astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "motorcycle_right.png",
    "retina.jpg", "hubble_deep_field.jpg", "ihc.png", "camera.png", "coins.png", "moon.png", "brick.png",
    "grass.png", "gravel.png")] + [MPL / "grace_hopper.jpg"]


def crops(w: int, h: int):
    """(tag, box, mirrored): 13 crops of a w x h photo."""
    s = min(w, h)
    yield "centre", ((w - s) // 2, (h - s) // 2, (w + s) // 2, (h + s) // 2), False
    yield "centre_mirror", ((w - s) // 2, (h - s) // 2, (w + s) // 2, (h + s) // 2), True
    for frac, tag in ((0.75, "big"), (0.55, "small")):
        t = int(s * frac)
        for name, (x, y) in (("tl", (0, 0)), ("tr", (w - t, 0)), ("bl", (0, h - t)), ("br", (w - t, h - t))):
            yield f"{tag}_{name}", (x, y, x + t, y + t), False
    c = int(s * 0.55)
    zoom = ((w - c) // 2, (h - c) // 2, (w + c) // 2, (h + c) // 2)
    yield "zoom", zoom, False
    yield "zoom_mirror", zoom, True
    t = int(s * 0.75)
    yield "big_tl_mirror", (0, 0, t, t), True


def main() -> None:
    for src in SOURCES:
        img = Image.open(src).convert("RGB")
        for tag, box, mirrored in crops(*img.size):
            out = img.crop(box).resize((224, 224), Image.LANCZOS)
            if mirrored:
                out = out.transpose(Image.FLIP_LEFT_RIGHT)
            out.save(HERE / f"{src.stem}_{tag}.jpg", quality=85)


if __name__ == "__main__":
    main()
