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
from cuvil.backend.llvm.codegen import generate
from cuvil.backend.llvm.kernels import fuse_pw_dw
from cuvil.backend.llvm.select import KernelTarget, kernel_passes
from cuvil.backend.llvm.target import GENERIC_BF16, DotIsa, host_target
from cuvil.ir import interpreter
from cuvil.options import Quantization
from cuvil.passes.pipeline import default_pipeline, plan_for, run_pipeline
from tests.quant.helpers import quantized, run_native

HOST = host_target()
DPBF16 = DotIsa(2, "dpbf16ps")


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
    plan_for(module, KernelTarget.of(None, bits, bf16=isa))
    return len(generate(module, "ftest", profile=True).profile_ops)


@pytest.mark.parametrize("precision, isa", [("f32", None), ("bf16", GENERIC_BF16), ("bf16", DPBF16)],
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
    del module.main.attrs["kernel_target"]  # select the kernels again
    plain, plain_calls = run_native(module, [x.numpy()], bits, bf16=isa)[0], _calls(module, bits, isa)
    assert calls == plain_calls - 1   # the expand ran inside the depthwise conv's kernel
    # the same code per value; only where a band's depthwise code contracts its products
    # into FMAs differently from the whole plane's can a result differ, by a rounding
    assert float(np.abs(fused - plain).max()) <= 1e-6 * scale


def test_fused_pair_gives_two_threads_the_bits_of_one():
    x = torch.randn(2, 6, 90, 75, generator=torch.Generator().manual_seed(4))
    model = _Inverted(6, 80, 1).eval()
    for precision in ("f32", "bf16"):
        q = Quantization(precision=precision)
        one = cuvil.compile(model, (x,), quantization=q, threads=1)
        two = cuvil.compile(model, (x,), quantization=q, threads=2)
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


def test_the_plan_keeps_the_expands_operands_alive_for_the_fused_kernel():
    """The depthwise conv's plan runs the expand inside it: the memory plan keeps the
    expand's input alive until the depthwise conv (`reads_producer`), so neither its
    result nor its scratch takes those bytes (the code generator checks it again)."""
    x = torch.randn(1, 8, 112, 112, generator=torch.Generator().manual_seed(6))
    module = _to_ir(_Inverted(8, 48, 2).eval(), (x,))
    run_pipeline(module, default_pipeline(**kernel_passes(KernelTarget(16))))
    forms = {op.attrs["kernel_plan"]["form"] for op in module.main.body.ops if op.name == "cuvil.conv2d"}
    assert {"in_depthwise", "fused_depthwise"} <= forms
    dw = next(op for op in module.main.body.ops if op.attrs.get("kernel_plan", {}).get("form") == "fused_depthwise")
    assert dw.attrs["kernel_plan"]["reads_producer"]
    expand_input = dw.operands[0].defining_op.operands[0].defining_op
    lo, hi = expand_input.attrs["arena_offset"], expand_input.attrs["arena_offset"] + expand_input.result.type.nbytes
    for at, n in ((dw.attrs["scratch_offset"], dw.attrs["scratch_bytes"]),
                  (dw.attrs["arena_offset"], dw.result.type.nbytes)):
        assert at + n <= lo or hi <= at
    ref = interpreter.run(module, [x.numpy()])[0]
    got = run_native(module, [x.numpy()], 512)[0]
    assert float(np.abs(got - ref).max()) <= 1e-5 * float(np.abs(ref).max())
