"""Regenerates the 224x224 JPEG crops in this directory from photos shipped inside
installed wheels (scikit-image's data directory and matplotlib's sample data): four
crops per photo (centre square, top-left and bottom-right 75% squares, centre 55%
square), resized with Pillow's LANCZOS filter, saved at JPEG quality 88.

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
    s = min(w, h)
    yield "centre", ((w - s) // 2, (h - s) // 2, (w + s) // 2, (h + s) // 2)
    t = int(s * 0.75)
    yield "topleft", (0, 0, t, t)
    yield "bottomright", (w - t, h - t, w, h)
    c = int(s * 0.55)
    yield "zoom", ((w - c) // 2, (h - c) // 2, (w + c) // 2, (h + c) // 2)


def main() -> None:
    for src in SOURCES:
        img = Image.open(src).convert("RGB")
        for tag, box in crops(*img.size):
            out = img.crop(box).resize((224, 224), Image.LANCZOS)
            out.save(HERE / f"{src.stem}_{tag}.jpg", quality=88)


if __name__ == "__main__":
    main()
