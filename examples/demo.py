"""Compile the pretrained MobileNetV2 with Cuvil and compare it with PyTorch eager.

Classifies examples/cat.jpg (scikit-image's ``chelsea`` photo) with both, then prints the largest
absolute difference between their logits, both top-5 class lists and both median
latencies. Exits non-zero if the two disagree on the top-1 class.

    python examples/demo.py [--threads N] [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cuvil  # noqa: E402
from examples.models.mobilenet_v2 import pretrained_mobilenet_v2  # noqa: E402

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
# ImageNet-1k classes 281..285 are the domestic cats.
CAT_CLASSES = range(281, 286)


def preprocess(path: Path, size: int = 224, resize_to: int = 256) -> np.ndarray:
    """The torchvision recipe, as the executable compiles it in: shorter side to
    ``resize_to`` (PIL bilinear), centre crop ``size``, scale to [0, 1], normalise with
    the ImageNet mean and std; NCHW float32."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    s = resize_to / min(w, h)
    img = img.resize((int(w * s) if w > h else resize_to, int(h * s) if h > w else resize_to), Image.BILINEAR)
    w, h = img.size
    left, top = int(round((w - size) / 2.0)), int(round((h - size) / 2.0))
    crop = np.asarray(img.crop((left, top, left + size, top + size)), np.float32) / 255.0
    normalised = (crop - IMAGENET_MEAN) / IMAGENET_STD
    return np.ascontiguousarray(normalised.transpose(2, 0, 1)[None], dtype=np.float32)


def median_latency_ms(fn, runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def top5(logits: np.ndarray) -> list[int]:
    return [int(i) for i in np.argsort(-logits.reshape(-1), kind="stable")[:5]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="threads for both engines")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per engine")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    model = pretrained_mobilenet_v2()
    x = preprocess(ROOT / "examples" / "cat.jpg")
    x_torch = torch.from_numpy(x)

    with torch.inference_mode():
        expected = model(x_torch).numpy()

    compiled = cuvil.compile(model, (x_torch,), threads=args.threads)
    got = np.asarray(compiled(x)[0])

    with torch.inference_mode():
        torch_ms = median_latency_ms(lambda: model(x_torch), args.runs)
    cuvil_ms = median_latency_ms(lambda: compiled(x), args.runs)

    torch_top5, cuvil_top5 = top5(expected), top5(got)
    print(f"input: examples/cat.jpg -> {x.shape} float32, threads={args.threads}")
    print(f"output shape: torch {expected.shape}, cuvil {got.shape}")
    print(f"max abs error (logits): {float(np.max(np.abs(got - expected))):.3e}")
    print(f"top-5 torch: {torch_top5}")
    print(f"top-5 cuvil: {cuvil_top5}")
    print(f"median latency over {args.runs} runs: torch {torch_ms:.2f} ms, cuvil {cuvil_ms:.2f} ms")

    if torch_top5[0] not in CAT_CLASSES:
        print(f"warning: torch's top-1 class {torch_top5[0]} is not a cat class", file=sys.stderr)
    if cuvil_top5[0] != torch_top5[0]:
        print("error: cuvil and torch disagree on the top-1 class", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
