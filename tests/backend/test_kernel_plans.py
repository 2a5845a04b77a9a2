"""Kernel plans pinned per (op, target): what select.SelectKernels / SelectStorage
record for one conv2d or matmul of each form, on three targets (AVX-512 with VNNI and
BF16, AVX2, NEON with dotprod), in golden text (kernel_plans.txt), the way IREE pins
its lowering strategies. A change of a kernel choice shows here line by line; when it
is on purpose, write the file again and say why in the commit:

    .venv/bin/python -m tests.backend.test_kernel_plans

Every conv and matmul form the backend has must appear in the golden text (the last
test checks), and each plan is checked against the interpreter natively where the host
runs its target's kernels.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

GOLDEN = Path(__file__).with_name("kernel_plans.txt")

_AVX512, _AVX2, _NEON = "avx512", "avx2", "neon"


def _targets():
    from cuvil.backend.llvm.select import KernelTarget
    from cuvil.backend.llvm.target import GENERIC_BF16, DotIsa
    return {_AVX512: KernelTarget(16, DotIsa(4, "vpdpbusd"), DotIsa(2, "dpbf16ps")),
            _AVX2: KernelTarget(8, DotIsa(2, "pmaddwd"), GENERIC_BF16),
            _NEON: KernelTarget(4, DotIsa(4, "sdot"), GENERIC_BF16)}


class _Linear(nn.Module):
    def __init__(self, k, n, batched=False, constant=True):
        super().__init__()
        torch.manual_seed(k + n)
        self.w = nn.Parameter(torch.randn(k, n) / k ** 0.5, requires_grad=False)
        self.batched, self.constant = batched, constant

    def forward(self, x, y=None):
        if not self.constant:
            return x @ y
        return x @ self.w


def _conv(cin, cout, k, hw, stride=1, groups=1, dilation=1):
    torch.manual_seed(cin * 31 + cout)
    return nn.Conv2d(cin, cout, k, stride, padding=dilation * (k // 2), groups=groups, dilation=dilation), \
        (torch.randn(1, cin, hw, hw),)


class _Expand(nn.Module):
    """A wide 1x1 conv whose result only a depthwise conv reads (fuse_pw_dw)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.e, self.d = nn.Conv2d(8, 48, 1), nn.Conv2d(48, 48, 3, 2, 1, groups=48)

    def forward(self, x):
        return self.d(torch.relu(self.e(x)))


class _Pairs(nn.Module):
    """bf16 convs whose result only a bf16 conv reads: stored as plane pairs (SelectStorage)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.a, self.b = nn.Conv2d(16, 32, 3, padding=1), nn.Conv2d(32, 32, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _cases():
    """name -> (model, inputs, quantization method, precision)."""
    x, y = torch.randn(1, 16, 64), torch.randn(1, 64, 32)
    return {
        "conv 1x1 32->64 @28x28": (*_conv(32, 64, 1, 28), "none", "f32"),
        "conv 3x3 64->64 @7x7": (*_conv(64, 64, 3, 7), "none", "f32"),
        "conv 3x3 16->16 @14x14": (*_conv(16, 16, 3, 14), "none", "f32"),
        "conv 3x3 s2 16->32 @14x14": (*_conv(16, 32, 3, 14, stride=2), "none", "f32"),
        "conv 3x3 dw 24 @20x20": (*_conv(24, 24, 3, 20, groups=24), "none", "f32"),
        "conv 3x3 3->2 @9x9": (*_conv(3, 2, 3, 9), "none", "f32"),
        "expand 1x1 8->48 + dw s2 @112x112": (_Expand(), (torch.randn(1, 8, 112, 112),), "none", "f32"),
        "conv 3x3 int8 16->32 @14x14": (*_conv(16, 32, 3, 14), "int8_sym", "f32"),
        "conv 3x3 int4 64->64 @14x14": (*_conv(64, 64, 3, 14), "int4_block", "f32"),
        "conv 3x3 bf16 32->32 @28x28": (*_conv(32, 32, 3, 28), "none", "bf16"),
        "conv 3x3 bf16 64->64 @7x7": (*_conv(64, 64, 3, 7), "none", "bf16"),
        "conv 3x3 bf16 dil2 31->32 @16x16": (*_conv(31, 32, 3, 16, dilation=2), "none", "bf16"),
        "conv 3x3 bf16 16->32 -> 1x1 32->32 @28x28": (_Pairs(), (torch.randn(1, 16, 28, 28),), "none", "bf16"),
        "matmul 16x64 @ const 64x32": (_Linear(64, 32), (x,), "none", "f32"),
        "matmul 16x64 @ 64x32": (_Linear(64, 32, constant=False), (x[0], y[0]), "none", "f32"),
        "matmul batched 1x16x64 @ 1x64x32": (_Linear(64, 32, constant=False), (x, y), "none", "f32"),
        "matmul int8 16x64 @ const 64x32": (_Linear(64, 32), (x,), "int8_sym", "f32"),
        "matmul int4 16x64 @ const 64x32": (_Linear(64, 32), (x,), "int4_block", "f32"),
        "matmul bf16 16x64 @ const 64x32": (_Linear(64, 32), (x,), "none", "bf16"),
    }


def _planned(model, inputs, method, precision, target):
    from cuvil.api import _to_ir
    from cuvil.backend.llvm.select import kernel_passes
    from cuvil.passes.pipeline import default_pipeline, run_pipeline
    module = _to_ir(model.eval(), inputs)
    quant = {"method": method, "precision": precision}
    if method == "int8_sym":
        quant["calibration"] = (tuple(np.asarray(t) for t in inputs),)
    run_pipeline(module, default_pipeline(**kernel_passes(target), quantize_weights=quant), verify_each=True)
    return module


def _plans(module) -> list[str]:
    from cuvil.ir.printer import format_attrs
    return [f"{op.name.split('.')[1]} {format_attrs(op.attrs['kernel_plan'])}" for op in module.main.body.ops
            if op.name in ("cuvil.conv2d", "cuvil.matmul", "cuvil.dequantize")]


def render() -> str:
    """The golden text: each case, then each target's plans."""
    lines = []
    cases = _cases()
    for name, (model, inputs, method, precision) in cases.items():
        lines.append(f"{name} ({method}, {precision})")
        for tname, target in _targets().items():
            for plan in _plans(_planned(model, inputs, method, precision, target)):
                lines.append(f"  {tname}: {plan}")
    return "\n".join(lines) + "\n"


def test_plans_match_the_golden_text():
    got = render()
    want = GOLDEN.read_text()
    if got != want:
        import difflib
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "kernel_plans.txt", "now"))
        raise AssertionError(f"kernel plans changed:\n{diff}\nre-record with `python -m tests.backend.test_kernel_plans`")


CONV_FORMS = {"gemm", "transposed", "winograd", "depthwise", "depthwise_masked", "direct", "fused_depthwise",
              "in_depthwise", "gemm_int8", "gemm_int4", "gemm_bf16", "gemm_bf16_widened", "transposed_bf16"}
MATMUL_FORMS = {"gemm", "batched", "packed", "packed_int8", "packed_int4", "packed_bf16", "packed_bf16_widened"}


def test_every_form_is_pinned():
    text = GOLDEN.read_text()
    for kind, forms in (("conv2d", CONV_FORMS), ("matmul", MATMUL_FORMS)):
        for form in forms:
            assert f'{kind} {{' in text and f'form = "{form}"' in text, f"no golden plan of a {kind} in form {form}"
    for flag in ("k_blocked", "in_place", "reads_producer", "out_pairs", "in_pairs"):
        assert f"{flag} = true" in text, f"no golden plan with {flag}"


def test_plans_run_on_the_host_and_match_the_interpreter():
    """Each case on the host's own width (its plans), against the interpreter."""
    from cuvil.backend.llvm.codegen import generate
    from cuvil.backend.llvm.jit import JitEngine
    from cuvil.backend.llvm.select import KernelTarget
    from cuvil.backend.llvm.target import host_target
    from cuvil.api import _JitModel
    from cuvil.ir import interpreter
    host = host_target()
    for name, (model, inputs, method, precision) in _cases().items():
        module = _planned(model, inputs, method, precision, KernelTarget.of(host))
        arrays = [np.asarray(t) for t in inputs]
        gen = generate(module, "plan")
        got = _JitModel(JitEngine(gen, host), gen, module)(*arrays)[0]
        ref = interpreter.run(module, arrays)[0]
        scale = float(np.abs(ref).max())
        assert float(np.abs(got - ref).max()) <= 2e-5 * scale, name


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(root), str(root / "compiler")]
    GOLDEN.write_text(render())
    print(GOLDEN.read_text())
