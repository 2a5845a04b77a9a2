"""Fixtures of the runtime tests: the models every test file uses, compiled once per session
(each artifact is linked once, on first use), so the suite stays fast on a small machine."""
from __future__ import annotations

import pytest
import torch

from .helpers import CNN_LABELS, Identity, Model, TinyCNN, TwoInOut, build_model


@pytest.fixture(scope="session")
def cnn(tmp_path_factory) -> Model:
    """An image classifier: f32[1,3,16,16] -> f32[1,10], image pre-processing, top-3 with labels."""
    torch.manual_seed(0)
    model = build_model(TinyCNN(), (torch.randn(1, 3, 16, 16),), "tiny_cnn", tmp_path_factory.mktemp("cnn"))
    name_in, name_out = model.manifest["inputs"][0]["name"], model.manifest["outputs"][0]["name"]
    model.manifest["preprocess"] = {name_in: {
        "kind": "image", "resize": 20, "crop": 16, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
        "scale": 1 / 255, "layout": "NCHW", "color": "RGB"}}
    model.manifest["postprocess"] = {name_out: {
        "kind": "classification", "top_k": 3, "softmax": True, "labels": CNN_LABELS}}
    return model


@pytest.fixture(scope="session")
def two(tmp_path_factory) -> Model:
    """Two inputs (x f32[2,12], y f32[2,6]) and two outputs, no pre/post-processing."""
    torch.manual_seed(1)
    return build_model(TwoInOut(), (torch.randn(2, 12), torch.randn(2, 6)), "two_io",
                       tmp_path_factory.mktemp("two"))


@pytest.fixture(scope="session")
def identity(tmp_path_factory) -> Model:
    """f32[768] in, the same out: the executable's output is exactly its pre-processed input.

    Only the byte count is fixed, so image tests declare any shape of 768 floats in
    their manifests ([1,3,16,16] NCHW, [1,16,16,3] NHWC, [1,1,24,32] grey)."""
    return build_model(Identity(), (torch.zeros(1, 3, 16, 16),), "img_id", tmp_path_factory.mktemp("identity"))
