"""JPEG and PNG inputs on every target: aarch64 executables link Debian's arm64 codecs,
wasm32 ones the codecs `python -m cuvil.wasm_codecs` builds; both must pre-process a
photo as the host executable does (and as the NumPy reference of tests/runtime/
test_images.py), classify photos as the host does, and refuse malformed images with
the host's one-line errors."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from PIL import Image

from cuvil.build import build
from cuvil.config import ConfigError, load_config
from tests.runtime.test_executable import _bad_inputs, check_bad_input
from tests.runtime.test_images import MEAN, STD, _image, reference

from .helpers import CROSS, REL_TOL, ROOT, available, run, tiny_project

IDENTITY_PY = '''\
import torch


class Identity(torch.nn.Module):
    def forward(self, x):
        return x * 1.0


def cuvil_entry():
    return Identity().eval(), (torch.zeros(1, 3, 16, 16),)
'''
PRE = {"resize": 20, "crop": 16, "layout": "NCHW", "color": "RGB", "mean": MEAN, "std": STD}
IDENTITY_YAML = f'''\
model:
  framework: pytorch
  name: img_id
  source: model.py
  entry: cuvil_entry
inputs:
  - name: x
    shape: [1, 3, 16, 16]
    dtype: f32
    preprocess: {{kind: image, resize: 20, crop: 16, scale: {1 / 255!r}, mean: {MEAN}, std: {STD}}}
outputs:
  - name: y
'''
# pre-processed pixels of another target's executable vs the host's: the same decoder
# sources, the same C resize; only float rounding may differ
SAME_AS_HOST = 1e-5


def _identity_exe(tmp_path_factory, target: str):
    d = tmp_path_factory.mktemp(f"identity-{target}")
    (d / "model.py").write_text(IDENTITY_PY)
    (d / "config.yaml").write_text(IDENTITY_YAML)
    return build(load_config(d / "config.yaml", target=target), d / "img_id", cache_dir=d / "cache",
                 log=lambda s: None)


@pytest.fixture(scope="module")
def identity_exes(tmp_path_factory):
    return {t: _identity_exe(tmp_path_factory, t) for t in ("host", "aarch64-linux-gnu", "wasm32-wasi")
            if available(t)}


def _write(kind: str, path, seed: int, size: tuple[int, int]) -> np.ndarray:
    """Write a test image of `kind`; the RGB pixels a decoder must see (PIL's decode for
    JPEG: libjpeg-turbo, as the executables)."""
    img = Image.fromarray(_image(seed, *size))
    if kind == "jpeg_baseline":
        img.save(path, "JPEG", quality=90)
    elif kind == "jpeg_progressive":
        img.save(path, "JPEG", quality=85, progressive=True, subsampling=2)
    elif kind == "jpeg_grey":
        img.convert("L").save(path, "JPEG", quality=95)
    elif kind == "png_rgb":
        img.save(path, "PNG")
    elif kind == "png_rgba":
        img.putalpha(90)  # alpha is dropped
        img.save(path, "PNG")
    elif kind == "png_grey":
        img.convert("L").save(path, "PNG")
    elif kind == "png_palette":
        img.quantize(colors=40).save(path, "PNG")
    elif kind == "png_grey16":  # v * 257 keeps v in the high byte, which the decoder keeps
        grey = np.asarray(img.convert("L")).astype(np.uint16)
        Image.fromarray(grey * 257).save(path, "PNG")
        return np.repeat(grey.astype(np.uint8)[..., None], 3, 2)
    return np.asarray(Image.open(path).convert("RGB"))


KINDS = ["jpeg_baseline", "jpeg_progressive", "jpeg_grey", "png_rgb", "png_rgba", "png_grey", "png_palette",
         "png_grey16"]


@pytest.mark.parametrize("target", CROSS)
@pytest.mark.parametrize("kind", KINDS)
def test_cross_target_preprocesses_images_as_host(identity_exes, tmp_path, target, kind):
    if "host" not in identity_exes:
        pytest.skip("no host C compiler")
    size = (31 + KINDS.index(kind), 45 - KINDS.index(kind))
    src = tmp_path / f"in.{'jpg' if kind.startswith('jpeg') else 'png'}"
    seen = _write(kind, src, KINDS.index(kind), size)
    host = run_image(identity_exes["host"], src, tmp_path / "host.npy")
    got = run_image(identity_exes[target], src, tmp_path / "got.npy")
    assert got.shape == (1, 3, 16, 16) and got.dtype == np.float32
    scale = float(np.abs(host).max())
    np.testing.assert_allclose(got, host, rtol=0, atol=SAME_AS_HOST * scale)
    ref = reference(seen, [1, 3, 16, 16], PRE)
    if kind.startswith("png"):  # lossless: the NumPy reference within the host tests' tolerance
        np.testing.assert_allclose(got, ref, rtol=0, atol=3e-4)
    else:  # PIL's libjpeg-turbo build may differ by a level in a few pixels (1/255/0.224 ~ 0.018)
        np.testing.assert_allclose(got, ref, rtol=0, atol=0.02)
        assert float(np.abs(got - ref).mean()) < 2e-3


def run_image(exe, src, out) -> np.ndarray:
    run(exe, "--input", src, "--output", out)
    return np.load(out)


# -- malformed images: the host's cases (tests/runtime/test_executable.py) ----------------------
@pytest.fixture(scope="module")
def tiny_image_exes(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_image")
    cfg = tiny_project(d)
    cfg.write_text(cfg.read_text().replace("    dtype: f32\n", "    dtype: f32\n    preprocess: {kind: image}\n", 1))
    exes = {}
    for t in ("aarch64-linux-gnu", "wasm32-wasi"):
        if available(t):  # named `tiny` (its error lines start with the program's name)
            (d / t).mkdir()
            exes[t] = build(load_config(cfg, target=t), d / t / "tiny", cache_dir=d / "cache", log=lambda s: None)
    return exes


@pytest.mark.parametrize("target", CROSS)
@pytest.mark.parametrize("name,data,phrase", _bad_inputs(), ids=[c[0] for c in _bad_inputs()])
def test_bad_input_exit_1_one_line_no_output(tiny_image_exes, tmp_path, target, name, data, phrase):
    check_bad_input(lambda src, out: run(tiny_image_exes[target], "--input", src, "--output", out, check=False),
                    "tiny", tmp_path, name, data, phrase)


# -- missing codecs: a config error at the image input -------------------------------------------
@pytest.mark.parametrize("target", CROSS)
def test_missing_codecs_are_a_clear_error(tmp_path, target, monkeypatch):
    cfg = tiny_project(tmp_path, "")
    cfg.write_text(cfg.read_text().replace("    dtype: f32\n", "    dtype: f32\n    preprocess: {kind: image}\n", 1))
    (tmp_path / "empty").mkdir()
    cc = None
    if target == "wasm32-wasi":
        monkeypatch.setenv("CUVIL_WASM32_CODECS", str(tmp_path / "empty"))
        want = "python -m cuvil.wasm_codecs"
    else:  # a sysroot without the arm64 archives
        cc = f"aarch64-linux-gnu-gcc --sysroot={tmp_path / 'empty'}"
        want = "libjpeg62-turbo-dev:arm64"
    with pytest.raises(ConfigError) as info:
        build(load_config(cfg, target=target), tmp_path / "x", cache_dir=tmp_path / "cache", cc=cc,
              log=lambda s: None)
    msg = str(info.value)
    assert f"{cfg}:10: inputs[0].preprocess" in msg and "libjpeg" in msg and want in msg, msg


# -- MobileNetV2 (the template, real weights) on photos, every target, through `cuvil run` -------
PHOTOS = {  # name: (source photo, size, format)
    "cat.jpg": ("cat.jpg", None, None),
    "coffee_baseline.jpg": ("photos/coffee_zoom.jpg", (300, 200), "jpeg"),
    "chelsea_progressive.jpg": ("photos/chelsea_centre.jpg", (257, 321), "progressive"),
    "rocket_rgb.png": ("photos/rocket_zoom.jpg", (240, 260), "RGB"),
    "astronaut_rgba.png": ("photos/astronaut_centre.jpg", (512, 384), "RGBA"),
    "camera_grey.png": ("photos/camera_centre.jpg", (256, 256), "L"),
    "motorcycle_palette.png": ("photos/motorcycle_left_zoom.jpg", (350, 280), "P"),
}
TARGETS = ["host", "x86_64-linux-gnu", "aarch64-linux-gnu", "wasm32-wasi"]
# host executable vs torch on the NumPy reference pre-processing (float32 vs float64
# resize, then 53 layers in float32; 1.5e-6 measured)
TORCH_TOL = 1e-4


def _photos(tmp_path) -> list:
    out = []
    for name, (src, size, fmt) in PHOTOS.items():
        path = tmp_path / name
        img = Image.open(ROOT / "examples" / src).convert("RGB")
        if size is None:
            path.write_bytes((ROOT / "examples" / src).read_bytes())
        else:
            img = img.resize(size, Image.BICUBIC)
            if fmt == "jpeg":
                img.save(path, "JPEG", quality=92)
            elif fmt == "progressive":
                img.save(path, "JPEG", quality=88, progressive=True)
            elif fmt == "RGBA":
                img.putalpha(200)
                img.save(path, "PNG")
            elif fmt == "P":
                img.quantize(colors=256).save(path, "PNG")
            else:
                img.convert(fmt).save(path, "PNG")
        out.append(path)
    return out


def test_mobilenet_v2_template_classifies_photos_alike_on_every_target(tmp_path):
    pytest.importorskip("examples.models.mobilenet_v2").pretrained_weights_path()
    cuvil = ROOT / ".venv/bin/cuvil"
    if not cuvil.exists():
        pytest.skip("no cuvil console script in .venv (make setup)")
    config = tmp_path / "mobilenet_v2.yaml"  # as docs/targets.md shows
    subprocess.run([str(cuvil), "init", "--template", "pytorch-mobilenetv2", str(config)], check=True,
                   capture_output=True)
    photos = _photos(tmp_path)
    targets = [t for t in TARGETS if available("host" if t == "x86_64-linux-gnu" else t)]
    logits, labels = {}, {}
    for target in targets:
        exe = tmp_path / f"mobilenet_v2-{target}"
        subprocess.run([str(cuvil), "build", "--config", str(config), "--output", str(exe), "--target", target,
                        "--cache-dir", str(tmp_path / "cache")], check=True, capture_output=True)
        for photo in photos:
            out = tmp_path / f"{target}-{photo.stem}.npy"
            proc = subprocess.run([str(cuvil), "run", str(exe), "--input", str(photo), "--output", str(out)],
                                  capture_output=True, text=True)
            assert proc.returncode == 0, (target, photo.name, proc.stderr)
            logits[target, photo.name] = np.load(out)
        proc = subprocess.run([str(cuvil), "run", str(exe), "--input", str(photos[0]), "--output",
                               str(tmp_path / f"{target}.json")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        labels[target] = json.loads((tmp_path / f"{target}.json").read_text())["top_k"][0]["label"]
    assert labels["host"] in ("tabby, tabby cat", "tiger cat", "Egyptian cat") and \
        set(labels.values()) == {labels["host"]}, labels
    errors, tops = {}, {}
    for (target, name), got in logits.items():
        host = logits["host", name]
        assert got.shape == host.shape == (1, 1000)
        errors[target, name] = float(np.abs(got.astype(np.float64) - host).max() / np.abs(host).max())
        assert errors[target, name] <= REL_TOL, (target, name, errors[target, name])
        tops.setdefault(name, set()).add(int(got.argmax()))
    assert all(len(t) == 1 for t in tops.values()), tops
    assert len({min(t) for t in tops.values()}) >= 4, tops  # the photos are not all one class
    # The host executable against torch on the NumPy reference pre-processing of the
    # lossless photos (PNG: no decoder differences).
    import torch

    from examples.models.mobilenet_v2 import pretrained_mobilenet_v2
    model = pretrained_mobilenet_v2()
    pre = {"resize": 256, "layout": "NCHW", "color": "RGB", "mean": MEAN, "std": STD}
    for photo in photos:
        if photo.suffix == ".png":
            seen = np.asarray(Image.open(photo).convert("RGB"))
            with torch.no_grad():
                ref = model(torch.from_numpy(reference(seen, [1, 3, 224, 224], pre))).numpy()
            host = logits["host", photo.name]
            errors["torch", photo.name] = float(np.abs(host.astype(np.float64) - ref).max() / np.abs(ref).max())
            assert errors["torch", photo.name] <= TORCH_TOL and int(ref.argmax()) == int(host.argmax()), \
                (photo.name, errors["torch", photo.name])
    print("relative errors:", {f"{t}/{n}": f"{e:.1e}" for (t, n), e in errors.items() if t != "host"})
