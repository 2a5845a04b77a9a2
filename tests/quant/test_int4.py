"""int4_block: the Q4_0 codec against its written definition, the int4 GEMM kernels
against the NumPy interpreter on the same quantized IR (every vector width, edge shapes),
and the weight bytes of a real network."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuvil
from cuvil.api import _to_ir
from cuvil.ir import interpreter
from cuvil.ir.ops.quant import q4_decode, q4_encode
from cuvil.passes.quantize_weights import weight_bytes
from tests.quant.helpers import quantized, run_native


def test_q4_codec_follows_the_block_definition():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((3, 70)).astype(np.float32)  # 70 = two blocks + 6, zero padded
    q = q4_encode(rows)
    assert q.shape == (3, 3, 18) and q.dtype == np.uint8
    for r in range(3):
        padded = np.zeros(96, np.float32)
        padded[:70] = rows[r]
        for blk in range(3):
            x = padded[blk * 32:(blk + 1) * 32]
            d = np.frombuffer(q[r, blk, :2].tobytes(), "<f2")[0]
            big = x[np.abs(x).argmax()]
            assert d == np.float16(big / -8.0)
            codes = [int(q[r, blk, 2 + j % 16]) >> (4 * (j >= 16)) & 15 for j in range(32)]
            assert codes[int(np.abs(x).argmax())] == 0  # the largest element is exactly -8 d
            want = np.clip(np.floor(x / (big / -8.0) + 8.5), 0, 15) if big else np.full(32, 8)
            assert codes == [int(c) for c in want]
    back = q4_decode(q, 70)
    scale = np.abs(rows).max()
    assert np.abs(back - rows).max() <= scale / 8  # half a step of the coarsest block, and more
    assert np.abs(back - rows).max() > 0


class _Net(torch.nn.Module):
    """GEMM convs (3x3 strided, 1x1, grouped), a depthwise conv (stays fp16), linears with
    K tails of < 16 and > 16 elements and N not a multiple of any panel width."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)              # reduction 27: fp16
        self.c2 = torch.nn.Conv2d(16, 40, 3, stride=2, padding=1)   # reduction 144
        self.dw = torch.nn.Conv2d(40, 40, 3, padding=1, groups=40)  # depthwise: fp16
        self.c3 = torch.nn.Conv2d(40, 24, 1)                        # pointwise, reduction 40
        self.c4 = torch.nn.Conv2d(24, 32, 3, padding=1, groups=2)   # grouped, reduction 108
        self.l1 = torch.nn.Linear(32 * 8 * 8, 70)                   # K 2048
        self.l2 = torch.nn.Linear(70, 37)                           # K 70: a tail of 6
        self.l3 = torch.nn.Linear(37, 19)                           # K 37: a tail of 5

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        y = torch.relu(self.c4(torch.relu(self.c3(self.dw(y)))))
        y = torch.relu(self.l2(torch.relu(self.l1(y.flatten(1)))))
        return self.l3(y)


@pytest.mark.parametrize("vector_bits", [128, 256, 512])
def test_int4_kernels_match_the_interpreter(vector_bits):
    model = _Net().eval()
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    module = quantized(_to_ir(model, (x,)), "int4_block")
    names = [op.name for op in module.main.body.ops]
    assert names.count("cuvil.dequantize") == 6  # c2, c3, c4, l1, l2, l3
    ref = interpreter.run(module, [x.numpy()])[0]
    got = run_native(module, [x.numpy()], vector_bits)[0]
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    with torch.no_grad():
        fp32 = model(x).numpy()
    err = np.abs(got - fp32).max() / np.abs(fp32).max()
    assert 1e-4 < err < 0.1, err  # really 4-bit, and still the same function


def test_int4_through_cuvil_compile_with_threads():
    model = _Net().eval()
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    module = quantized(_to_ir(model, (x,)), "int4_block")
    ref = interpreter.run(module, [x.numpy()])[0]
    got = cuvil.compile(model, (x,), quantization="int4_block", threads=2)(x.numpy())[0]
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_int4_block_weights_of_mobilenet_v2_are_about_0_15_of_fp32():
    from examples.models import mobilenet_v2
    model = mobilenet_v2.pretrained_mobilenet_v2()
    (x,) = mobilenet_v2.example_inputs()
    sizes = {q: weight_bytes(quantized(_to_ir(model, (x,)), q)) for q in ("none", "int4_block")}
    ratio = sizes["int4_block"] / sizes["none"]
    assert 0.14 <= ratio <= 0.16, ratio  # 18/128 for int4 blocks; depthwise fp16, biases f32


def test_gptq_codes_fit_the_product_better_than_rounding():
    from cuvil.passes.quantize_int4 import gptq_encode
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 70)) @ rng.standard_normal((70, 70))  # correlated inputs
    w = rng.standard_normal((24, 70)).astype(np.float32)
    errs = []
    for q in (q4_encode(w), gptq_encode(w, x.T @ x / len(x))):
        assert q.shape == (24, 3, 18)
        errs.append(np.linalg.norm(x @ (q4_decode(q, 70) - w).T) / np.linalg.norm(x @ w.T))
    assert errs[1] < 0.85 * errs[0], errs
