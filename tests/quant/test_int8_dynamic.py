"""int8_sym with symbolic dims: calibration runs inputs of different batch sizes, and
the int8 GEMMs take a runtime M (every remainder of the micro-kernel's row count). Each
batch size must give exactly what a model compiled for that static size gives."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuvil
from cuvil.options import Quantization


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 24, 3, stride=2, padding=1)
        self.fc1 = torch.nn.Linear(24 * 8 * 8, 40)
        self.fc2 = torch.nn.Linear(40, 10)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    calibration = [(rng.standard_normal((n, 3, 16, 16)).astype(np.float32),) for n in (1, 3, 2, 4)]
    return _Net().eval(), calibration, rng


def _rebatched(calibration, n):
    """The same images in batches of n (the last one padded with the first image): the
    same min/max ranges for a model of static batch n."""
    images = np.concatenate([c[0] for c in calibration])
    images = np.concatenate([images, np.repeat(images[:1], -len(images) % n, axis=0)])
    return [(images[i:i + n],) for i in range(0, len(images), n)]


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "shared"])
def test_int8_runtime_batch_matches_static_builds(setup, jit):
    model, calibration, rng = setup
    dyn = cuvil.compile(model, (torch.from_numpy(calibration[1][0]),),
                        quantization=Quantization("int8_sym", calibration=calibration),
                        dynamic_shapes=[("batch", 3, 16, 16)], dim_bounds={"batch": (1, 8)}, jit=jit)
    for n in (1, 2, 3, 4, 7):
        x = rng.standard_normal((n, 3, 16, 16)).astype(np.float32)
        static = cuvil.compile(model, (torch.from_numpy(x),),
                               quantization=Quantization("int8_sym", calibration=_rebatched(calibration, n)),
                               jit=True)
        (got,), (want,) = dyn(x), static(x)
        assert got.shape == (n, 10)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        with torch.no_grad():
            ref = model(torch.from_numpy(x)).numpy()
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert 1e-5 < err < 0.1, err  # really int8, still close to f32


def test_calibration_inputs_outside_the_bounds_are_refused(setup):
    model, calibration, _ = setup
    outside = calibration + [(np.zeros((9, 3, 16, 16), np.float32),)]
    with pytest.raises(cuvil.CuvilError, match="calibration input 'x'.*outside its bounds"):
        cuvil.compile(model, (torch.from_numpy(calibration[1][0]),),
                      quantization=Quantization("int8_sym", calibration=outside),
                      dynamic_shapes=[("batch", 3, 16, 16)], dim_bounds={"batch": (1, 8)}, jit=True)
