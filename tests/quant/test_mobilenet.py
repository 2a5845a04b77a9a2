"""MobileNetV2 with the real ImageNet weights on the 64 real photos of examples/photos:
top-1 agreement of fp16 and int8_sym with fp32, int8 against onnxruntime's static QDQ
quantization of the same model with the same calibration images, and weight bytes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuvil
from cuvil.api import _to_ir
from cuvil.options import Quantization
from cuvil.passes.quantize_weights import weight_bytes
from examples.models import mobilenet_v2
from tests.quant import mobilenet_data as md
from tests.quant.helpers import quantized

BATCH = 16
KEEP_F32 = 6  # the most sensitive of MobileNetV2's 36 int8 candidates (see quantize_int8.py)


@pytest.fixture(scope="module")
def photos():
    x = md.images()
    assert len(x) >= 50
    model = mobilenet_v2.pretrained_mobilenet_v2()
    example = (torch.from_numpy(x[:BATCH]),)
    calibration = [(x[md.calibration_indices()],)]  # one batch: the centre crop of each of the 16 photos
    assert calibration[0][0].shape[0] == BATCH

    def logits(compiled):
        return np.concatenate([compiled(x[i:i + BATCH])[0] for i in range(0, len(x), BATCH)])
    fp32 = logits(cuvil.compile(model, example, threads=2))
    return model, x, example, calibration, fp32, logits


def _agreement(got, fp32):
    top, prob = fp32.argmax(1), md.softmax(fp32).max(1)
    same = got.argmax(1) == top
    return float(same.mean()), float(same[prob >= 0.5].mean()), int((prob >= 0.5).sum())


def test_fp16_agrees_with_fp32(photos):
    model, x, example, _, fp32, logits = photos
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    assert (fp32.argmax(1) == ref.argmax(1)).all()  # Cuvil fp32 is torch's classifier
    overall, _, _ = _agreement(logits(cuvil.compile(model, example, quantization="fp16", threads=2)), fp32)
    print(f"fp16 top-1 agreement {overall:.3f}")
    assert overall >= 0.995


def test_bf16_agrees_with_fp32(photos):
    """precision bf16: top-1 agreement with fp32 over all photos (measured 1.0) and the
    logits' relative error (max |diff| / max |logit|, measured ~1e-2)."""
    model, x, example, _, fp32, logits = photos
    compiled = cuvil.compile(model, example, quantization=Quantization(precision="bf16"), threads=2)
    assert compiled.ir.main.attrs["precision"]["bf16_ops"] == 36   # the depthwise convs stay f32
    got = logits(compiled)
    overall, confident, _ = _agreement(got, fp32)
    rel = float(np.abs(got - fp32).max() / np.abs(fp32).max())
    print(f"bf16 top-1 agreement {overall:.3f} (confident {confident:.3f}), logits rel. error {rel:.2e}")
    assert overall >= 0.98 and confident == 1.0
    assert 1e-5 < rel <= 5e-2


def test_int8_sym_agrees_with_fp32_and_beats_onnxruntime_qdq(photos, tmp_path):
    pytest.importorskip("onnxruntime")
    from tests.quant.ort_reference import export_onnx, quantize_qdq, run_onnx
    model, x, example, calibration, fp32, logits = photos
    compiled = cuvil.compile(model, example, threads=2,
                             quantization=Quantization("int8_sym", calibration=calibration, keep_f32=KEEP_F32))
    report = compiled.ir.main.attrs["quantization"]
    assert report["int8_ops"] == 36 - KEEP_F32 and len(report["kept_f32"]) == KEEP_F32
    overall, confident, n_conf = _agreement(logits(compiled), fp32)

    onnx_fp32 = export_onnx(model, torch.from_numpy(x[:1]), tmp_path / "mobilenet_v2.onnx")
    onnx_q = quantize_qdq(onnx_fp32, calibration[0][0], tmp_path / "mobilenet_v2.qdq.onnx")
    assert (run_onnx(onnx_fp32, x).argmax(1) == fp32.argmax(1)).all()
    ort_overall, ort_confident, _ = _agreement(run_onnx(onnx_q, x), fp32)
    print(f"int8_sym top-1 agreement {overall:.3f} (fp32 prob >= 0.5: {confident:.3f} of {n_conf}); "
          f"onnxruntime QDQ {ort_overall:.3f} ({ort_confident:.3f}); kept f32: "
          f"{[k['index'] for k in report['kept_f32']]}")
    assert n_conf >= 15
    assert confident >= 0.99
    assert overall >= 0.90
    assert overall > ort_overall


def test_weight_bytes_per_method(photos):
    model, _, example, calibration, _, _ = photos
    sizes = {q: weight_bytes(quantized(_to_ir(model, example), q, calibration=tuple(calibration) if q == "int8_sym"
                                       else ())) for q in ("none", "fp16", "int8_sym", "int4_block")}
    ratios = {q: sizes[q] / sizes["none"] for q in sizes}
    print("weight bytes / fp32:", {q: round(r, 3) for q, r in ratios.items()})
    assert 0.49 <= ratios["fp16"] <= 0.53
    assert 0.25 <= ratios["int8_sym"] <= 0.28   # depthwise weights and biases stay f32
    assert 0.14 <= ratios["int4_block"] <= 0.16
