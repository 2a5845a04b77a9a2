"""bf16 conv results stored as plane pairs of codes (qkernels.stored_pairs): where every
reader is a bf16 conv that rounds its input to bf16 anyway, the producer stores the
codes of channels 2i and 2i + 1 together and the readers skip their conversion. The
numbers must not change at all: checked bit for bit against the same module without
pairs, and against the interpreter, for column-panel and transposed producers (ragged
channel panels, odd row blocks), and 1x1 (column-panel, ragged panels, transposed) and
3x3 (stride 1 and 2) readers, batch 2; and that a result read elsewhere stays f32."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from cuvil.api import _to_ir
from cuvil.backend.llvm import qkernels
from cuvil.backend.llvm.qgemm8 import Int8Isa
from cuvil.backend.llvm.target import host_target
from cuvil.ir import interpreter
from tests.quant.helpers import quantized, run_native

HOST = host_target()
DPBF16 = Int8Isa(2, "dpbf16ps")

pytestmark = pytest.mark.skipif(not (HOST.has_feature("avx512bf16") and HOST.has_feature("avx512vl")),
                                reason="this CPU has no AVX-512-BF16")


class _Chain(nn.Module):
    """ResNet's bottleneck without its residual: reduce 1x1 -> ReLU -> 3x3 -> ReLU ->
    expand 1x1; `both` also returns the 3x3 conv's result."""

    def __init__(self, cin, mid, cout, stride, both=False):
        super().__init__()
        torch.manual_seed(cin * mid + stride)
        self.reduce, self.expand = nn.Conv2d(cin, mid, 1), nn.Conv2d(mid, cout, 1)
        self.conv = nn.Conv2d(mid, mid, 3, stride, 1)
        self.both = both

    def forward(self, x):
        h = torch.relu(self.conv(torch.relu(self.reduce(x))))
        y = self.expand(h)
        return (y, h) if self.both else y


CASES = [  # cin, mid, cout, stride, input shape
    (32, 40, 64, 1, (1, 32, 24, 26)),   # 624 pixels: a ragged last panel; 40 channels: a ragged channel panel
    (48, 38, 48, 2, (2, 48, 28, 28)),   # 38 channels: a last row block of 2; a 14x14 (transposed) expand; batch 2
    (16, 64, 32, 1, (1, 16, 7, 7)),     # thin planes: every conv transposed
]


def _run(module, x, monkeypatch, pairs: bool, bits: int = 512):
    chosen = []
    real = qkernels.stored_pairs

    def spy(*args, **kwargs):
        got = real(*args, **kwargs) if pairs else set()
        chosen.append(len(got))
        return got
    monkeypatch.setattr(qkernels, "stored_pairs", spy)
    return run_native(module, [x], bits, bf16=DPBF16), chosen[0]


@pytest.mark.parametrize("bits", [256, 512])
@pytest.mark.parametrize("cin, mid, cout, stride, shape", CASES)
def test_pairs_change_no_bit_of_the_result(cin, mid, cout, stride, shape, bits, monkeypatch):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(stride)).numpy()
    module = quantized(_to_ir(_Chain(cin, mid, cout, stride).eval(), (torch.from_numpy(x),)), "none",
                       precision="bf16")
    (got,), chosen = _run(module, x, monkeypatch, True, bits)
    assert chosen == 2   # the reduce conv's result and the 3x3 conv's
    (plain,), none = _run(module, x, monkeypatch, False, bits)
    assert none == 0
    np.testing.assert_array_equal(got, plain)
    ref = interpreter.run(module, [x])[0]
    # the interpreter rounds the same bf16 inputs; f32 sums in another order, and a
    # rounding of an f32 value may then round a bf16 input the other way (2^-8 of it)
    assert float(np.abs(got - ref).max()) <= 4e-3 * float(np.abs(ref).max())


class _Gated(_Chain):
    """The 3x3 conv's epilogue also scales by a value per image ([N, 1, 1, 1]: read row
    by row, where the bias is a vector over the channels)."""

    def forward(self, x):
        gate = torch.sigmoid(x.mean((1, 2, 3), keepdim=True))
        h = torch.relu(self.conv(torch.relu(self.reduce(x)))) * gate
        return self.expand(h)


def test_an_epilogue_operand_per_image_is_read_row_by_row(monkeypatch):
    x = torch.randn(2, 16, 7, 7, generator=torch.Generator().manual_seed(4)).numpy()
    module = quantized(_to_ir(_Gated(16, 64, 32, 1).eval(), (torch.from_numpy(x),)), "none", precision="bf16")
    conv = [op for op in module.main.body.ops if op.name == "cuvil.conv2d"][1]
    assert len(conv.operands) == 4   # the bias and the gate in its epilogue
    (got,), chosen = _run(module, x, monkeypatch, True)
    assert chosen == 2
    (plain,), _ = _run(module, x, monkeypatch, False)
    np.testing.assert_array_equal(got, plain)


def test_a_result_read_elsewhere_stays_f32(monkeypatch):
    x = torch.randn(1, 32, 24, 26, generator=torch.Generator().manual_seed(3)).numpy()
    model = _Chain(32, 40, 64, 1, both=True).eval()
    module = quantized(_to_ir(model, (torch.from_numpy(x),)), "none", precision="bf16")
    (y, h), chosen = _run(module, x, monkeypatch, True)
    assert chosen == 1   # only the reduce conv's: the 3x3 conv's result is also an output
    want_y, want_h = interpreter.run(module, [x])
    for got, want in ((y, want_y), (h, want_h)):
        assert float(np.abs(got - want).max()) <= 4e-3 * float(np.abs(want).max())


def test_no_pairs_without_the_bf16_dot_product_or_masked_vectors():
    x = torch.randn(1, 32, 24, 26)
    module = quantized(_to_ir(_Chain(32, 40, 64, 1).eval(), (x,)), "none", precision="bf16")
    ops, outs = module.main.body.ops, {id(v) for v in module.main.outputs}
    assert len(qkernels.stored_pairs(ops, outs, DPBF16, 16)) == 2
    assert not qkernels.stored_pairs(ops, outs, DPBF16, 4)                       # 128-bit vectors
    assert not qkernels.stored_pairs(ops, outs, Int8Isa(2, "bf16"), 16)          # no vdpbf16ps
