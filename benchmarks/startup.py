"""Cold start-to-first-result time and peak RSS: the Cuvil executable vs. Python + torch.

Both classify examples/cat.jpg with the pretrained MobileNetV2, each in a fresh process:
the executable from `cuvil build` (pre-processing compiled in), and
`python -c 'import torch; ...'` doing the same pre-processing in NumPy and one inference.
Runs are interleaved; medians and ratios are printed. Not a test: numbers vary by machine.

    python benchmarks/startup.py [--exe dist/mobilenet_v2] [--runs 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TORCH_SCRIPT = r"""
import sys
sys.path.insert(0, {root!r})
import numpy as np, torch
from skimage import io, transform
from examples.models.mobilenet_v2 import pretrained_mobilenet_v2
img = io.imread({image!r})
h, w = img.shape[:2]; s = 256 / min(h, w)
img = transform.resize(img, (round(h * s), round(w * s)), order=1, preserve_range=True) / 255.0
t, l = (img.shape[0] - 224) // 2, (img.shape[1] - 224) // 2
x = ((img[t:t + 224, l:l + 224] - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).astype(np.float32)
with torch.inference_mode():
    logits = pretrained_mobilenet_v2()(torch.from_numpy(x.transpose(2, 0, 1)[None].copy()))
print(int(logits.argmax()))
"""


def measure(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one fresh process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({proc.returncode}): {err.strip()}")
    return wall, usage.ru_maxrss / 1024.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exe", default=str(ROOT / "dist" / "mobilenet_v2"))
    ap.add_argument("--image", default=str(ROOT / "examples" / "cat.jpg"))
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    exe = Path(args.exe)
    if not exe.is_file():
        print(f"building {exe} ...", flush=True)
        subprocess.run([sys.executable, "-m", "cuvil.cli", "build", "--config",
                        str(ROOT / "examples" / "mobilenet_v2.yaml"), "--output", str(exe)], check=True)
    out = Path(tempfile.mkdtemp()) / "pred.json"
    cuvil_cmd = [str(exe), "--input", args.image, "--output", str(out)]
    torch_cmd = [sys.executable, "-c", TORCH_SCRIPT.format(root=str(ROOT), image=args.image)]
    results = {"cuvil executable": [], "python + torch": []}
    measure(cuvil_cmd)  # warm the page cache for both before timing
    measure(torch_cmd)
    for _ in range(args.runs):
        results["cuvil executable"].append(measure(cuvil_cmd))
        results["python + torch"].append(measure(torch_cmd))
    print(f"MobileNetV2, {args.image}, {args.runs} interleaved runs each (medians)")
    print(f"{'':18} {'start-to-result':>16} {'peak RSS':>10}")
    med = {}
    for name, rs in results.items():
        wall = statistics.median(r[0] for r in rs)
        rss = statistics.median(r[1] for r in rs)
        med[name] = (wall, rss)
        print(f"{name:18} {wall * 1000:13.1f} ms {rss:7.1f} MiB")
    (cw, cr), (tw, tr) = med["cuvil executable"], med["python + torch"]
    print(f"ratio torch/cuvil: time {tw / cw:.1f}x, memory {tr / cr:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
