"""The config's `quantization` (and `precision`) sections -> an options.Quantization, and
the calibration inputs it names.

    quantization:
      method: int8_sym              # or say it with weight/activation:
      weight: {dtype: int8, scheme: symmetric, granularity: per_channel}
      activation: {dtype: uint8, scheme: asymmetric, granularity: per_tensor}
      qat_mode: false               # true: a PT2E-quantized graph; its own scales, no calibration
      keep_f32: 2                   # the most sensitive int8 ops stay f32
      calibration:
        files: [calib/*.npy, photos/a.jpg]   # .npy (one input), .npz (named inputs), images
        generator: mypkg.calib:batches       # or a function yielding input tuples
        ranges: minmax                       # or percentile (with percentile: 99.99)

Files are resolved against the config and hashed into the compile options (the
compile stage's cache key: options.CalibrationFiles); images go through the input's `preprocess` (resize, crop,
scale, mean, std, layout, color) in Python with Pillow.
"""
from __future__ import annotations

import glob
import hashlib
import importlib
from dataclasses import replace
from pathlib import Path

import numpy as np

from .errors import CuvilError
from .options import CalibrationFiles, Quantization

# The config's weight.dtype / activation.dtype -> the method / activation codes they name.
WEIGHT_DTYPES = {"f16": "fp16", "int8": "int8_sym", "int4": "int4_block"}
ACTIVATION_DTYPES = {"uint8": "u8", "int8": "i8"}
_GRANULARITY = {"fp16": (None,), "int8_sym": ("per_channel",), "int4_block": ("per_block",)}
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def quantization_from_config(cfg) -> Quantization:
    """The Quantization of cfg's quantization and precision sections; errors name the key
    and line."""
    q = cfg.data.get("quantization") or {}
    precision = cfg.data.get("precision", "f32")
    method = q.get("method")
    weight, act = q.get("weight") or {}, q.get("activation") or {}
    if weight:
        implied = WEIGHT_DTYPES[weight["dtype"]]
        if method and method != implied:
            raise cfg.error(["quantization", "weight", "dtype"], f"{weight['dtype']} weights are method {implied}, "
                            f"but quantization.method is {method}")
        method = implied
        gran = weight.get("granularity")
        if gran and gran not in _GRANULARITY[method] + ("per_tensor",) or gran == "per_tensor":
            raise cfg.error(["quantization", "weight", "granularity"], f"{method} weights are "
                            f"{_GRANULARITY[method][0] or 'whole tensors'}, not {gran}")
        if weight.get("scheme") == "asymmetric":
            raise cfg.error(["quantization", "weight", "scheme"], "weights are quantized symmetrically")
    method = method or "none"
    narrowed = "int8_sym" if q.get("qat_mode") else method
    if precision == "bf16" and narrowed != "none":
        raise cfg.error(["precision"], f"precision bf16 computes in bfloat16 with its own bf16 weights; it does "
                        f"not combine with quantization method {narrowed!r} (use one or the other)")
    opts: dict = {"precision": precision}
    if q.get("qat_mode"):
        if method not in ("none", "int8_sym"):
            raise cfg.error(["quantization", "qat_mode"], f"qat_mode takes the int8 scales from the model's "
                            f"quantize/dequantize nodes; it does not combine with method {method}")
        for key in ("calibration", "keep_f32"):
            if key in q:
                raise cfg.error(["quantization", key], f"qat_mode: the scales come from the model's own "
                                f"quantize/dequantize nodes; remove quantization.{key}")
        # the mapping's activation dtype is checked against the graph's own nodes
        expect = ACTIVATION_DTYPES[act["dtype"]] if act.get("dtype") else ""
        return Quantization("int8_sym", qat=True, activation=expect, **opts)
    if act:
        if method != "int8_sym":
            raise cfg.error(["quantization", "activation"], f"{method} quantizes weights only; activations "
                            "are quantized by int8 weights (weight.dtype: int8)")
        dtype = ACTIVATION_DTYPES[act.get("dtype", "uint8")]
        scheme = act.get("scheme", "asymmetric" if dtype == "u8" else "symmetric")
        if (dtype, scheme) not in (("u8", "asymmetric"), ("i8", "symmetric")):
            raise cfg.error(["quantization", "activation", "scheme"], "activations are uint8 asymmetric or "
                            "int8 symmetric")
        opts["activation"] = dtype
    if "keep_f32" in q:
        opts["keep_f32"] = q["keep_f32"]
    cal = q.get("calibration")
    if method == "int8_sym" and not cal:
        raise cfg.error(["quantization"], "int8_sym needs calibration inputs: add quantization.calibration "
                        "(files or a generator)")
    if cal:
        opts["ranges"] = cal.get("ranges", "minmax")
        if "percentile" in cal:
            opts["percentile"] = float(cal["percentile"])
        files = []
        for i, pattern in enumerate(cal.get("files", [])):
            matches = sorted(glob.glob(str(cfg.resolve(pattern))))
            if not matches:
                raise cfg.error(["quantization", "calibration", "files", i], f"no file matches {cfg.resolve(pattern)}")
            try:
                files.extend(calibration_files(matches))
            except CuvilError as e:
                raise cfg.error(["quantization", "calibration", "files", i], str(e)) from None
        opts["calibration"] = CalibrationFiles(tuple(files), cal.get("generator"))
    try:
        return Quantization(method, **opts)
    except CuvilError as e:
        raise cfg.error(["quantization"], str(e)) from None


def calibration_files(paths) -> list[tuple[str, str]]:
    """(path, sha256) of each calibration file (the compile options hold their hashes)."""
    out = []
    for m in paths:
        p = Path(m)
        if p.suffix.lower() not in (".npy", ".npz") + IMAGE_SUFFIXES:
            raise CuvilError(f"{p.name}: calibration files are .npy, .npz or images (.jpg, .png)")
        if not p.is_file():
            raise CuvilError(f"calibration file {p}: no such file")
        out.append((str(p), _sha(p)))
    return out


def with_calibration_files(q: Quantization, paths) -> Quantization:
    """q with these calibration files instead of the config's (`cuvil compile
    --calibration`, as the Bazel rule passes its declared files)."""
    if q.qat:
        raise CuvilError("qat_mode: the scales come from the model's own quantize/dequantize nodes; "
                         "--calibration does not apply")
    return replace(q, calibration=CalibrationFiles(tuple(calibration_files(paths))))


def _image(path: Path, pre: dict, shape) -> np.ndarray:
    from PIL import Image
    img = Image.open(path).convert("RGB")
    if isinstance(pre.get("resize"), int):
        w, h = img.size
        s = pre["resize"] / min(w, h)
        img = img.resize((max(1, round(w * s)), max(1, round(h * s))), Image.BILINEAR)
    crop = pre.get("crop")
    if crop:
        ch, cw = (crop, crop) if isinstance(crop, int) else crop
        w, h = img.size
        left, top = (w - cw) // 2, (h - ch) // 2
        img = img.crop((left, top, left + cw, top + ch))
    x = np.asarray(img, np.float32) * float(pre.get("scale", 1 / 255))
    if pre.get("color") == "BGR":
        x = x[..., ::-1]
    x = (x - np.asarray(pre.get("mean", [0.0]), np.float32)) / np.asarray(pre.get("std", [1.0]), np.float32)
    if pre.get("layout", "NCHW") == "NCHW":
        x = x.transpose(2, 0, 1)
    return np.ascontiguousarray(x, np.float32)


def calibration_inputs(cal: CalibrationFiles, fn, preprocess: dict) -> list[tuple]:
    """The input tuples the calibration files and generator name, for the function fn."""
    shapes = [a.type.shape for a in fn.args]
    out, images = [], []
    for path, _ in cal.files:
        p = Path(path)
        if p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                missing = [n for n in fn.input_names if n not in z]
                if missing:
                    raise CuvilError(f"calibration file {p}: no array for input(s) {', '.join(missing)}")
                out.append(tuple(z[n] for n in fn.input_names))
        elif len(fn.args) != 1:
            raise CuvilError(f"calibration file {p}: a model with {len(fn.args)} inputs takes .npz files "
                             "(one array per input name)")
        elif p.suffix == ".npy":
            out.append((np.load(p, allow_pickle=False),))
        else:
            pre = preprocess.get(fn.input_names[0])
            if not pre or pre.get("kind") != "image":
                raise CuvilError(f"calibration image {p}: input {fn.input_names[0]!r} has no image preprocess")
            images.append(_image(p, pre, shapes[0]))
    if images:  # batches of the input's batch size (a last partial batch is left out)
        n = shapes[0][0] if isinstance(shapes[0][0], int) else 1
        if len(images) < n:
            raise CuvilError(f"{len(images)} calibration image(s) do not fill one batch of {n}")
        out.extend((np.stack(images[i:i + n]),) for i in range(0, len(images) - n + 1, n))
    if cal.generator:
        mod, _, name = cal.generator.partition(":")
        try:
            gen = getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError) as e:
            raise CuvilError(f"quantization.calibration.generator {cal.generator!r}: {e}") from None
        out.extend(tuple(np.asarray(a) for a in (b if isinstance(b, (tuple, list)) else (b,))) for b in gen())
    return out
