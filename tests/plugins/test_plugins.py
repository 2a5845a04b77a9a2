"""The plugin examples (examples/plugins/): a PPM pre-processor, a detection JSON
post-processor and a custom activation op, built into one executable and checked on
every target this machine runs (host, aarch64 under qemu, wasm32 under node:wasi)
against torch and a Python reimplementation of the post-processing."""
from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import torch

from cuvil.build import build
from cuvil.config import ConfigError, load_config
from cuvil.errors import LinkError, UnsupportedOpError

from tests.targets.helpers import ALL, ROOT, assert_close, run

EXAMPLE = ROOT / "examples" / "plugins"
OPTIONS = {"score_threshold": 0.8, "iou_threshold": 0.3, "labels": ["cat", "dog", "bird"]}


def _models():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import models  # noqa: PLC0415
    finally:
        sys.path.remove(str(EXAMPLE))
    return models


def write_ppm(path, rgb: np.ndarray, comment: bytes = b"# made by the test\n"):
    h, w, _ = rgb.shape
    path.write_bytes(b"P6\n" + comment + f"{w} {h}\n255\n".encode() + rgb.astype(np.uint8).tobytes())


def reference_tensor(rgb: np.ndarray, shape=(32, 32)) -> np.ndarray:
    """What ppm_image.c computes: bilinear resize (torch, half-pixel), then (v/255 - 0.5) / 0.25."""
    x = torch.from_numpy(rgb.astype(np.float32)).permute(2, 0, 1)[None]
    x = torch.nn.functional.interpolate(x, size=shape, mode="bilinear", align_corners=False)
    return ((x / 255.0 - 0.5) / 0.25).numpy()


def reference_detections(out: np.ndarray) -> list[dict]:
    """detections.c in Python: threshold, per-class greedy NMS, best first."""
    rows = out.reshape(-1, out.shape[-1]).astype(np.float64)
    cand = []
    for r in rows:
        cls = int(np.argmax(r[4:]))
        if r[4 + cls] < OPTIONS["score_threshold"]:
            continue
        box = [r[0] - r[2] / 2, r[1] - r[3] / 2, r[0] + r[2] / 2, r[1] + r[3] / 2]
        cand.append({"class": cls, "score": r[4 + cls], "box": box})
    cand.sort(key=lambda d: -d["score"])

    def iou(a, b):
        ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = ix * iy
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        return inter / union if union > 0 else 0.0
    kept = []
    for d in cand:
        if all(k["class"] != d["class"] or iou(k["box"], d["box"]) <= OPTIONS["iou_threshold"] for k in kept):
            kept.append(dict(d, label=OPTIONS["labels"][d["class"]]))
    return kept


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("plugin-cache")


@pytest.mark.parametrize("target", ALL)
def test_plugin_examples_run_in_order_and_match(target, cache, tmp_path):
    exe = build(load_config(EXAMPLE / "detector.yaml", target=target), tmp_path / "detector", cache_dir=cache,
                log=lambda s: None)
    rng = np.random.default_rng(11)
    rgb = rng.integers(0, 256, (40, 52, 3))
    write_ppm(tmp_path / "photo.ppm", rgb)
    model, _ = _models().cuvil_entry()
    with torch.no_grad():
        ref = model(torch.from_numpy(reference_tensor(rgb))).numpy()
    # pre-processing plugin -> model with the custom op -> the raw tensor (.npy)
    run(exe, "--input", tmp_path / "photo.ppm", "--output", tmp_path / "raw.npy")
    raw = np.load(tmp_path / "raw.npy")
    assert_close(raw, ref)
    # ... -> the post-processing plugin's JSON
    run(exe, "--input", tmp_path / "photo.ppm", "--output", tmp_path / "detections.json")
    got = json.loads((tmp_path / "detections.json").read_text())["detections"]
    want = reference_detections(raw)
    assert 0 < len(got) < 64 and len(got) == len(want)
    for g, w in zip(got, want):
        assert (g["class"], g["label"]) == (w["class"], w["label"])
        assert abs(g["score"] - w["score"]) < 2e-6 and np.allclose(g["box"], w["box"], atol=2e-6)
    assert [d["class"] for d in reference_detections(ref)] == [d["class"] for d in got]
    # a bad input is the plugin's message, exit 1, no output file
    (tmp_path / "not.ppm").write_bytes(b"GIF89a....")
    bad = run(exe, "--input", tmp_path / "not.ppm", "--output", tmp_path / "bad.json", check=False)
    assert bad.returncode == 1 and "ppm_image: not a binary PPM (P6) or PGM (P5) file" in bad.stderr
    assert not (tmp_path / "bad.json").exists()
    truncated = (tmp_path / "photo.ppm").read_bytes()[:-10]
    (tmp_path / "short.ppm").write_bytes(truncated)
    bad = run(exe, "--input", tmp_path / "short.ppm", "--output", tmp_path / "bad.json", check=False)
    assert bad.returncode == 1 and "truncated" in bad.stderr


def test_ppm_plugin_grey_image_without_resize(cache, tmp_path):
    """P5 at the input's size: no interpolation, grey repeated over the channels."""
    exe = build(load_config(EXAMPLE / "detector.yaml"), tmp_path / "detector", cache_dir=cache, log=lambda s: None)
    grey = np.random.default_rng(2).integers(0, 256, (32, 32)).astype(np.uint8)
    (tmp_path / "g.pgm").write_bytes(b"P5 32 32 255\n" + grey.tobytes())
    run(exe, "--input", tmp_path / "g.pgm", "--output", tmp_path / "raw.npy")
    x = np.repeat(((grey.astype(np.float32) / 255 - 0.5) / 0.25)[None, None], 3, axis=1)
    model, _ = _models().cuvil_entry()
    with torch.no_grad():
        assert_close(np.load(tmp_path / "raw.npy"), model(torch.from_numpy(x)).numpy())
    help_text = run(exe, "--help").stdout
    assert "plugin 'ppm_image'" in help_text and "plugin 'detections'" in help_text


def _variant(tmp_path, old: str, new: str):
    for f in ("models.py", "ppm_image.c", "detections.c", "squareplus.c"):
        shutil.copy(EXAMPLE / f, tmp_path / f)
    text = (EXAMPLE / "detector.yaml").read_text()
    assert old in text
    (tmp_path / "detector.yaml").write_text(text.replace(old, new))
    return tmp_path / "detector.yaml"


def test_custom_op_without_its_module_fails_at_link_naming_the_symbol(cache, tmp_path):
    cfg = _variant(tmp_path, "modules: [ppm_image.c, detections.c, squareplus.c]", "modules: [ppm_image.c, detections.c]")
    with pytest.raises(LinkError, match="cuvil_squareplus"):
        build(load_config(cfg), tmp_path / "d", cache_dir=cache, log=lambda s: None)


def test_unmapped_custom_op_is_an_unsupported_op(cache, tmp_path):
    cfg = _variant(tmp_path, '    - {op: "cuvil_examples::squareplus", symbol: cuvil_squareplus}\n', "")
    cfg.write_text(cfg.read_text().replace("  custom_ops:                     # framework op", "  # framework op"))
    with pytest.raises(UnsupportedOpError, match="cuvil_examples::squareplus") as e:
        build(load_config(cfg), tmp_path / "d", cache_dir=tmp_path / "cache", log=lambda s: None)
    assert "models.py:" in str(e.value)  # the model line that called it


def test_config_naming_an_undefined_plugin_is_a_config_error(tmp_path):
    cfg = _variant(tmp_path, "plugin: detections", "plugin: boxes_to_json")
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    line = cfg.read_text().splitlines().index("    plugin: boxes_to_json") + 1
    assert str(e.value).startswith(f"{cfg}:{line}: plugin.postprocess.plugin: no module in plugin.modules defines "
                                   "CUVIL_PLUGIN(boxes_to_json, ...) (defined: detections, ppm_image, squareplus)")
