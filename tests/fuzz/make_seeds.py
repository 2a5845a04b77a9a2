"""Writes the fuzz harnesses' seed corpora (tests/fuzz/corpus/<harness>/): small valid
inputs of each kind, so the fuzzers start from files that reach deep into the parsers.
The files are committed; run this again only to change them:

    .venv/bin/python tests/fuzz/make_seeds.py
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

CORPUS = Path(__file__).resolve().parent / "corpus"


def npy(arr: np.ndarray, version=None, fortran=False) -> bytes:
    buf = io.BytesIO()
    if version is None:
        np.save(buf, np.asfortranarray(arr) if fortran else arr)
    else:
        np.lib.format.write_array(buf, arr, version=version)
    return buf.getvalue()


def image(fmt: str, mode: str, size=(14, 12), **kw) -> bytes:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    img = Image.fromarray(pixels).convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def seeds() -> dict[str, dict[str, bytes]]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    images = {
        "rgb.png": image("PNG", "RGB"),
        "rgba.png": image("PNG", "RGBA"),
        "grey.png": image("PNG", "L"),
        "palette.png": image("PNG", "P"),
        "interlaced.png": image("PNG", "RGB", interlace=1),
        "rgb.jpg": image("JPEG", "RGB", quality=90),
        "grey.jpg": image("JPEG", "L", quality=75),
        "progressive.jpg": image("JPEG", "RGB", quality=80, progressive=True),
        "large.png": image("PNG", "RGB", size=(40, 30)),
    }
    return {
        "npy": {
            "f32_1x3x16x16.npy": npy(x),
            "i64_7.npy": npy(np.arange(7, dtype=np.int64)),
            "u8_2x0x5.npy": npy(np.zeros((2, 0, 5), np.uint8)),
            "v2.npy": npy(np.arange(7, dtype=np.int64), version=(2, 0)),
            "fortran.npy": npy(rng.standard_normal((3, 4)).astype(np.float32), fortran=True),
            "big_endian.npy": npy(np.arange(7, dtype=">i8")),
        },
        # The first byte picks the pre-processing (fuzz_image.c): 0..11 covers them all.
        "image": {f"{mode:02d}-{name}": bytes([mode]) + data
                  for mode, (name, data) in enumerate(list(images.items()) * 2) if mode < 12},
        "plugin_options": {
            "two.txt": b"threshold\x000.5\x00labels\x00a,b,c",
            "repeat.txt": b"k\x001\x00k\x002\x00\x00empty key",
            "escapes.txt": b"path\x00/tmp/\x1b[31mred\\\x7f\xff\x00unicode\x00caf\xc3\xa9",
        },
    }


def main() -> None:
    for harness, files in seeds().items():
        d = CORPUS / harness
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            old.unlink()
        for name, data in files.items():
            (d / name).write_bytes(data)
        print(f"{d}: {len(files)} seeds")


if __name__ == "__main__":
    main()
