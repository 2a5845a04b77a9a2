"""A 1x1 conv fused into the depthwise conv that alone reads it (backend/llvm/fuse_pw_dw.py):
the depthwise conv's output rows in bands, each band's 1x1 rows computed into a buffer
first. Checked against the interpreter and against the same model unfused, f32 and
bf16, at 256 and 512 bits: stride 1 and 2, a ragged last band, bottom padding, batch 2;
and that it does not fuse where the 1x1 conv's result is read elsewhere."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import cuvil
from cuvil.api import _to_ir
from cuvil.backend.llvm import fuse_pw_dw
from cuvil.backend.llvm.codegen import generate
from cuvil.backend.llvm.qgemm8 import BF16_GENERIC, Int8Isa
from cuvil.backend.llvm.target import host_target
from cuvil.ir import interpreter
from tests.quant.helpers import quantized, run_native

HOST = host_target()
DPBF16 = Int8Isa(2, "dpbf16ps")


class _Inverted(nn.Module):
    """A conv, then MobileNetV2's inverted residual without the residual: expand 1x1 ->
    ReLU6 -> depthwise 3x3 -> ReLU6 -> project 1x1; `both` also returns the expand's
    result. The expand's input is an arena tensor read by nothing after it: the memory
    plan must keep it until the fused depthwise conv (whose scratch is large)."""

    def __init__(self, cin, c, stride, both=False, mult=1):
        super().__init__()
        torch.manual_seed(cin * c + stride)
        self.pre = nn.Conv2d(cin, cin, 3, padding=1)
        self.e, self.p = nn.Conv2d(cin, c, 1), nn.Conv2d(c * mult, 8, 1)
        self.d = nn.Conv2d(c, c * mult, 3, stride, 1, groups=c)
        self.both = both

    def forward(self, x):
        h = nn.functional.relu6(self.e(torch.relu(self.pre(x))))
        y = self.p(nn.functional.relu6(self.d(h)))
        return (y, h) if self.both else y


CASES = [  # cin, channels, stride, channel multiplier, input shape; every expand result is >= 2 MiB
    (8, 48, 2, 1, (1, 8, 112, 112)),
    (6, 80, 1, 1, (2, 6, 90, 75)),     # 5 bands of 19 rows, the last of 14; batch 2
    (5, 40, 2, 1, (1, 5, 131, 140)),   # odd height: the last band's windows reach past it
    (4, 32, 1, 2, (1, 4, 150, 130)),   # two depthwise outputs per channel
]


def _module(model, x, precision):
    return quantized(_to_ir(model, (x,)), "none", precision=precision)


def _calls(module, bits, isa) -> int:
    return len(generate(module, "ftest", bits, profile=True, bf16=isa).profile_ops)


@pytest.mark.parametrize("precision, isa", [("f32", None), ("bf16", BF16_GENERIC), ("bf16", DPBF16)],
                         ids=["f32", "bf16-generic", "bf16-dpbf16ps"])
@pytest.mark.parametrize("bits", [256, 512])
@pytest.mark.parametrize("cin, c, stride, mult, shape", CASES)
def test_fused_expand_and_depthwise_match_the_interpreter_and_the_unfused_kernels(cin, c, stride, mult, shape, bits,
                                                                                 precision, isa, monkeypatch):
    if isa is DPBF16 and not (HOST.has_feature("avx512bf16") and HOST.has_feature("avx512vl")):
        pytest.skip("this CPU has no AVX-512-BF16")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(stride))
    module = _module(_Inverted(cin, c, stride, mult=mult).eval(), x, precision)
    ref = interpreter.run(module, [x.numpy()])[0]
    fused, calls = run_native(module, [x.numpy()], bits, bf16=isa)[0], _calls(module, bits, isa)
    scale = float(np.abs(ref).max())
    # f32: the summation order; bf16: also an f32 rounding in the depthwise conv's output
    # may round the project conv's bf16 input the other way (2^-8 of that value)
    assert float(np.abs(fused - ref).max()) <= (1e-5 if precision == "f32" else 4e-3) * scale
    monkeypatch.setattr(fuse_pw_dw, "FUSE_MIN_BYTES", 1 << 60)
    plain, plain_calls = run_native(module, [x.numpy()], bits, bf16=isa)[0], _calls(module, bits, isa)
    assert calls == plain_calls - 1   # the expand ran inside the depthwise conv's kernel
    # the same code per value; only where a band's depthwise code contracts its products
    # into FMAs differently from the whole plane's can a result differ, by a rounding
    assert float(np.abs(fused - plain).max()) <= 1e-6 * scale


def test_fused_pair_gives_two_threads_the_bits_of_one():
    x = torch.randn(2, 6, 90, 75, generator=torch.Generator().manual_seed(4))
    model = _Inverted(6, 80, 1).eval()
    for precision in ("f32", "bf16"):
        one = cuvil.compile(model, (x,), precision=precision, threads=1)
        two = cuvil.compile(model, (x,), precision=precision, threads=2)
        np.testing.assert_array_equal(one(x.numpy())[0], two(x.numpy())[0])


def test_an_expand_read_elsewhere_is_not_fused():
    x = torch.randn(1, 8, 112, 112, generator=torch.Generator().manual_seed(5))
    model = _Inverted(8, 48, 2, both=True).eval()
    module = _module(model, x, "f32")
    dw = next(op for op in module.main.body.ops if op.name == "cuvil.conv2d" and op.attrs["groups"] > 1)
    assert fuse_pw_dw.pointwise_producer(dw) is None
    got = cuvil.compile(model, (x,))(x.numpy())
    for g, want in zip(got, model(x)):
        np.testing.assert_allclose(g, want.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_a_plan_without_the_backends_reads_runs_the_pair_unfused():
    """Planned with the scratch sizes alone, the depthwise conv's result or scratch may
    take the bytes of the expand's input, which dies at the expand: the code generator
    then keeps the two kernels apart instead of reading overwritten input."""
    from cuvil.backend.llvm.kernels import scratch_bytes
    from cuvil.passes.pipeline import default_pipeline, run_pipeline
    x = torch.randn(1, 8, 112, 112, generator=torch.Generator().manual_seed(6))   # there it does take them
    module = _to_ir(_Inverted(8, 48, 2).eval(), (x,))
    run_pipeline(module, default_pipeline(memory_plan={"scratch": scratch_bytes}))
    ref = interpreter.run(module, [x.numpy()])[0]
    got = run_native(module, [x.numpy()], 512)[0]
    assert float(np.abs(got - ref).max()) <= 1e-5 * float(np.abs(ref).max())
