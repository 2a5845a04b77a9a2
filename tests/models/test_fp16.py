"""quantization="fp16": conv/matmul weights stored as f16 (half the bytes), computed in f32."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuvil
from cuvil.api import _to_ir
from cuvil.passes.pipeline import default_pipeline, run_pipeline
from cuvil.passes.quantize_weights import weight_bytes
from examples.models import mobilenet_v2
from tests.models_zoo import ZOO

# fp16 rounds each weight by at most 2^-11 relative; through a network the outputs move
# by about that much relative to their scale.
FP16_REL_TOL = 5e-3


def test_fp16_halves_the_weights_of_mobilenet_v2():
    model = mobilenet_v2.pretrained_mobilenet_v2()
    (x,) = mobilenet_v2.example_inputs()
    sizes = {}
    for q in ("none", "fp16"):
        module = _to_ir(model, (x,))
        run_pipeline(module, default_pipeline(quantize_weights={"method": q}))
        sizes[q] = weight_bytes(module)
    ratio = sizes["fp16"] / sizes["none"]
    assert 0.49 <= ratio <= 0.53, ratio  # biases stay f32


def test_fp16_mobilenet_v2_keeps_the_prediction_on_the_cat():
    from tests.cli.test_build import ROOT, _torchvision_style
    model = mobilenet_v2.pretrained_mobilenet_v2()
    x = _torchvision_style(ROOT / "examples" / "cat.jpg")
    fp32 = cuvil.compile(model, (torch.from_numpy(x),))(x)[0]
    fp16 = cuvil.compile(model, (torch.from_numpy(x),), quantization="fp16")(x)[0]
    assert np.abs(fp16 - fp32).max() <= FP16_REL_TOL * np.abs(fp32).max()
    assert list(np.argsort(-fp16[0])[:5]) == list(np.argsort(-fp32[0])[:5])


@pytest.mark.parametrize("name", ["vit", "decoder", "se_cnn", "attention_cnn"])
def test_fp16_zoo_models_stay_close_to_torch(name):
    model, inputs = ZOO[name](0)
    got = cuvil.compile(model, inputs, quantization="fp16")(*[t.numpy() for t in inputs])[0]
    with torch.no_grad():
        ref = model(*inputs).numpy()
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert 1e-7 < err <= FP16_REL_TOL  # really rounded, and still close


def test_unknown_quantization_and_int8_without_calibration_are_clear_errors():
    model, inputs = ZOO["vit"](0)
    with pytest.raises(cuvil.CuvilError, match="not supported"):
        cuvil.compile(model, inputs, quantization="int3")
    with pytest.raises(cuvil.CuvilError, match="needs calibration"):
        cuvil.compile(model, inputs, quantization="int8_sym")
