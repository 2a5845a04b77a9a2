"""The NumPy interpreter runs captured models and matches torch eager."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuvil.ir as cir
from cuvil.errors import CuvilError
from tests.ir.models import NAMES, captured

# Each op's reference computes in float64 and rounds to float32, torch stays in float32:
# differences grow with depth (ResNet-18, 4 BERT layers) but stay ~1e-6 of O(1) outputs.
ATOL, RTOL = 2e-5, 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_captured_model_matches_torch(name):
    model, inputs, module = captured(name)
    with torch.no_grad():
        want = model(*inputs)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    got = cir.run(module, [x.numpy() for x in inputs])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = w.numpy()
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
        assert np.abs(w).max() > 1e-3  # a meaningful output, not all zeros
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=RTOL)


def test_bundle_reload_runs_identically(tmp_path):
    _, inputs, module = captured("se_cnn")
    cir.write_bundle(module, tmp_path / "m.cvir")
    arrays = [x.numpy() for x in inputs]
    for a, b in zip(cir.run(module, arrays), cir.run(cir.read_bundle(tmp_path / "m.cvir"), arrays)):
        assert a.tobytes() == b.tobytes()


def test_wrong_input_count_is_an_error():
    _, inputs, module = captured("bert")
    with pytest.raises(CuvilError, match="takes 2 inputs, got 1"):
        cir.run(module, [inputs[0].numpy()])


def test_wrong_input_shape_names_the_input():
    _, inputs, module = captured("resnet18")
    with pytest.raises(CuvilError, match=f"input {module.main.input_names[0]!r}: expected shape"):
        cir.run(module, [np.zeros((1, 3, 32, 32), np.float32)])


def test_erf_and_gelu_references_are_double_precision():
    """The references behind erf and GELU (SciPy's erf where installed) agree with
    math.erf per element in float64, and GELU with torch's float64 GELU rounded to float32."""
    import math

    from cuvil.ir.ops import elementwise

    x = np.concatenate([np.linspace(-7, 7, 20001), [0.0, -0.0, 1e-300, 30.0, -30.0]])
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(elementwise._erf(x), want, rtol=2e-15, atol=1e-300)
    x32 = np.linspace(-9, 9, 4001, dtype=np.float32)
    got = elementwise._f(x32, elementwise._gelu)
    assert got.dtype == np.float32
    want = torch.nn.functional.gelu(torch.from_numpy(x32).double()).float().numpy()
    np.testing.assert_allclose(got, want, rtol=1.2e-7, atol=1e-30)
