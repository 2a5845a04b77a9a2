"""Image inputs through the executable against a NumPy reference of the same
pre-processing (decode -> resize -> centre crop -> scale, mean/std -> layout).

The model is the identity, so the executable's .npy output *is* the tensor its
pre-processing made. The reference resize is checked against PIL's BILINEAR resize
(the convention torchvision's PIL path follows) within PIL's 8-bit rounding.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
from PIL import Image

from cuvil.native import link_artifact

from .helpers import run_c

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
VARIANTS = {
    # name: (declared shape, pre-processing)
    "nchw_rgb_short": ([1, 3, 16, 16], {"resize": 20, "crop": 16, "layout": "NCHW", "color": "RGB"}),
    "nhwc_bgr_exact": ([1, 16, 16, 3], {"resize": [18, 24], "crop": [16, 16], "layout": "NHWC", "color": "BGR"}),
    "gray_crop_only": ([1, 1, 24, 32], {"layout": "NCHW", "color": "GRAY", "mean": 0.5, "std": 0.25}),
}


@pytest.fixture(scope="session")
def image_exes(identity, tmp_path_factory):
    """One executable per pre-processing variant, all on the identity model's objects."""
    out = tmp_path_factory.mktemp("image_exes")
    exes = {}
    for name, (shape, pre) in VARIANTS.items():
        m = copy.deepcopy(identity.manifest)
        m["inputs"][0]["shape"] = m["outputs"][0]["shape"] = shape
        c = shape_c(shape, pre)
        m["preprocess"] = {m["inputs"][0]["name"]: {"kind": "image", "scale": 1 / 255, "mean": MEAN[:c],
                                                    "std": STD[:c], **pre}}
        exes[name] = link_artifact("exe", identity.objects, m, None, out / name)
    return exes


def shape_c(shape, pre) -> int:
    return shape[1] if pre["layout"] == "NCHW" else shape[3]


def _weights(n_in: int, n_out: int, offset: int, count: int) -> np.ndarray:
    """Rows of the triangle filter: output pixel offset+i of an n_in -> n_out resize."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    k = np.arange(n_in) + 0.5
    rows = []
    for i in range(count):
        w = np.clip(1.0 - np.abs((k - (offset + i + 0.5) * scale) / support), 0.0, None)
        rows.append(w / w.sum())
    return np.array(rows)


def _resize_crop(rgb: np.ndarray, resize, out_h: int, out_w: int) -> np.ndarray:
    h, w = rgb.shape[:2]
    if isinstance(resize, int):
        rh, rw = (resize, int(resize * w / h)) if h <= w else (int(resize * h / w), resize)
    elif resize:
        rh, rw = resize
    else:
        rh, rw = h, w
    top, left = round((rh - out_h) / 2), round((rw - out_w) / 2)  # Python rounds half to even, as torchvision
    return np.einsum("yh,hwc,xw->yxc", _weights(h, rh, top, out_h), rgb.astype(np.float64),
                     _weights(w, rw, left, out_w), optimize=True)


def reference(rgb: np.ndarray, shape, pre) -> np.ndarray:
    """NumPy reference of the executable's image pre-processing."""
    c = shape_c(shape, pre)
    out_h, out_w = (shape[2], shape[3]) if pre["layout"] == "NCHW" else (shape[1], shape[2])
    img = _resize_crop(rgb, pre.get("resize"), out_h, out_w)
    if pre["color"] == "BGR":
        img = img[..., ::-1]
    elif pre["color"] == "GRAY":
        img = img @ np.array([0.299, 0.587, 0.114])[:, None]
    mean = np.broadcast_to(np.asarray(pre.get("mean", MEAN[:c]), np.float64), (c,))
    std = np.broadcast_to(np.asarray(pre.get("std", STD[:c]), np.float64), (c,))
    img = (img / 255 - mean) / std
    return (img.transpose(2, 0, 1) if pre["layout"] == "NCHW" else img)[None].astype(np.float32)


def _image(seed: int, h: int, w: int) -> np.ndarray:
    """A smooth random RGB image (JPEG keeps smooth images close to their pixels)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (h // 4 + 2, w // 4 + 2, 3)).astype(np.float64)
    ys, xs = np.linspace(0, base.shape[0] - 1.001, h), np.linspace(0, base.shape[1] - 1.001, w)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    img = (base[y0][:, x0] * (1 - fy) * (1 - fx) + base[y0 + 1][:, x0] * fy * (1 - fx)
           + base[y0][:, x0 + 1] * (1 - fy) * fx + base[y0 + 1][:, x0 + 1] * fy * fx)
    return np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8)


def _run(exe, src, tmp_path) -> np.ndarray:
    out = tmp_path / "out.npy"
    proc = run_c(exe, "--input", src, "--output", out)
    assert proc.returncode == 0, proc.stderr
    return np.load(out)


@pytest.mark.parametrize("variant,size", [("nchw_rgb_short", (26, 37)), ("nchw_rgb_short", (41, 23)),
                                          ("nhwc_bgr_exact", (12, 10)), ("nhwc_bgr_exact", (40, 50)),
                                          ("gray_crop_only", (29, 40)), ("gray_crop_only", (24, 32))])
def test_png_matches_numpy_reference(image_exes, tmp_path, variant, size):
    shape, pre = VARIANTS[variant]
    rgb = _image(sum(size), *size)
    Image.fromarray(rgb).save(tmp_path / "in.png")
    got = _run(image_exes[variant], tmp_path / "in.png", tmp_path)
    ref = reference(rgb, shape, pre)
    assert got.shape == tuple(shape) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * float(np.abs(ref).max()))
    if variant == "gray_crop_only" and size == (24, 32):  # no resampling at all: exact pixels
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "I;16"])
def test_png_colour_types_decode_to_rgb(image_exes, tmp_path, mode):
    rgb = _image(7, 30, 30)
    img = Image.fromarray(rgb)
    if mode == "RGBA":
        img.putalpha(77)  # alpha is dropped
    elif mode == "P":
        img = img.quantize(colors=32)
    elif mode == "L":
        img = img.convert("L")
    else:  # 16-bit grey: v * 257 keeps v in the high byte, which the decoder keeps
        img = Image.fromarray(np.asarray(img.convert("L")).astype(np.uint16) * 257)
    img.save(tmp_path / "in.png")
    seen = np.asarray(img.convert("RGB")) if mode != "I;16" else \
        np.repeat((np.asarray(img) >> 8).astype(np.uint8)[..., None], 3, 2)
    shape, pre = VARIANTS["nchw_rgb_short"]
    got = _run(image_exes["nchw_rgb_short"], tmp_path / "in.png", tmp_path)
    np.testing.assert_allclose(got, reference(seen, shape, pre), rtol=0, atol=3e-4)


@pytest.mark.parametrize("quality,subsampling", [(95, 0), (80, 2)])
def test_jpeg_matches_numpy_reference(image_exes, tmp_path, quality, subsampling):
    rgb = _image(11, 33, 45)
    Image.fromarray(rgb).save(tmp_path / "in.jpg", quality=quality, subsampling=subsampling)
    decoded = np.asarray(Image.open(tmp_path / "in.jpg").convert("RGB"))  # PIL's libjpeg-turbo
    shape, pre = VARIANTS["nchw_rgb_short"]
    got = _run(image_exes["nchw_rgb_short"], tmp_path / "in.jpg", tmp_path)
    ref = reference(decoded, shape, pre)
    # Two libjpeg-turbo builds may differ by a level in a few pixels (1/255/0.224 ~ 0.018).
    np.testing.assert_allclose(got, ref, rtol=0, atol=0.02)
    assert float(np.abs(got - ref).mean()) < 2e-3


def test_grey_jpeg(image_exes, tmp_path):
    grey = _image(5, 21, 21)[..., 0]
    Image.fromarray(grey).save(tmp_path / "in.jpg", quality=95)
    decoded = np.repeat(np.asarray(Image.open(tmp_path / "in.jpg"))[..., None], 3, 2)
    shape, pre = VARIANTS["nchw_rgb_short"]
    got = _run(image_exes["nchw_rgb_short"], tmp_path / "in.jpg", tmp_path)
    np.testing.assert_allclose(got, reference(decoded, shape, pre), rtol=0, atol=0.02)


@pytest.mark.parametrize("size", [(26, 37), (17, 80), (64, 21)])
def test_reference_resize_is_pils_bilinear(size):
    """Our resize convention is PIL's BILINEAR (antialiased when shrinking), up to PIL's rounding."""
    rgb = _image(3, *size)
    h, w = size
    rh, rw = (20, int(20 * w / h)) if h <= w else (int(20 * h / w), 20)
    pil = np.asarray(Image.fromarray(rgb).resize((rw, rh), Image.BILINEAR)).astype(np.float64)
    top, left = round((rh - 16) / 2), round((rw - 16) / 2)
    ours = _resize_crop(rgb, 20, 16, 16)
    assert np.abs(ours - pil[top:top + 16, left:left + 16]).max() <= 1.0


def test_image_smaller_than_crop_is_refused(image_exes, tmp_path):
    Image.fromarray(_image(2, 20, 31)).save(tmp_path / "small.png")  # grey variant needs 24x32, no resize
    proc = run_c(image_exes["gray_crop_only"], "--input", tmp_path / "small.png", "--output", tmp_path / "o.npy")
    assert proc.returncode == 1
    assert proc.stderr.startswith("gray_crop_only: input 'x' (") and "smaller than the model's 32x24 crop" in proc.stderr
    assert not (tmp_path / "o.npy").exists()
