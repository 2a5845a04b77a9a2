"""Non-f32 dtypes through the backend (bugs found by the ONNX node tests)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuvil
from cuvil.ir import parse_module


@pytest.mark.parametrize("name, fn, make", [
    ("f64 math", lambda x: torch.exp(x) + torch.tanh(x) * torch.sigmoid(x), lambda: torch.randn(3, 4, dtype=torch.float64)),
    ("bool amax", lambda x: (x > 0).amax(1), lambda: torch.tensor([[1.0, -1, 1], [-1, -1, -1]])),
    ("bool amin", lambda x: (x > 0).amin(1), lambda: torch.tensor([[1.0, -1, 1], [1, 1, 1]])),
    ("i64 amax", lambda x: x.amax(1), lambda: torch.randint(-100, 100, (3, 7), generator=torch.Generator().manual_seed(0))),
    ("i32 amin", lambda x: x.amin(0), lambda: torch.randint(-9, 9, (5, 3), dtype=torch.int32, generator=torch.Generator().manual_seed(1))),
])
def test_dtype_reductions_and_math(name, fn, make):
    x = make()
    got = cuvil.compile(fn, (x,))(x.numpy())[0]
    ref = fn(x).numpy()
    assert got.dtype == ref.dtype
    # f64 math runs through the float32 library: float32 accuracy.
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=1e-6, atol=1e-6)


def test_u8_max_pool():
    text = '''func @main(%0: tensor<[1, 1, 5, 5], u8> "x") -> ("y") {
  %1 = cuvil.max_pool2d(%0) {ceil_mode = false, dilation = [1, 1], kernel = [2, 2], pads = [0, 0, 0, 0], stride = [1, 1]} : tensor<[1, 1, 4, 4], u8>
  cuvil.return(%1)
}
'''
    x = np.random.default_rng(0).integers(0, 256, (1, 1, 5, 5)).astype(np.uint8)
    got = cuvil.compile(parse_module(text), ())(x)[0]
    ref = torch.nn.functional.max_pool2d(torch.from_numpy(x).float(), 2, 1).numpy().astype(np.uint8)
    np.testing.assert_array_equal(got, ref)
