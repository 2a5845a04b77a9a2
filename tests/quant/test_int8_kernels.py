"""The int8 GEMM kernels (qgemm8.py) against the NumPy interpreter on the same quantized
IR: matmul (A @ W, activations quantized once into scratch) and conv2d (W @ B, the im2col
panels quantized in place), every dot product this host can run (vpmaddwd, the generic
pair form and the generic quad forms that share the VNNI and AArch64 sdot layouts),
ragged M / N / K, u8 and i8 activations with zero points and code ranges, weight codes
over all of -128..127. And: VNNI targets get vpdpbusd, AVX2 targets vpmaddwd, AArch64 with the
dot-product extension sdot (cross-compiled; tests/targets runs it under qemu)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cuvil.api import _to_ir
from cuvil.backend.llvm.codegen import generate
from cuvil.backend.llvm.select import KernelTarget
from cuvil.backend.llvm.target import DotIsa, Target, compile_to_asm, host_target, int8_dot_isa
from cuvil.ir import interpreter
from cuvil.passes.pipeline import plan_for
from tests.quant.helpers import quantized, run_native

HOST_AVX2 = host_target().has_feature("avx2")
ISAS = [DotIsa(2, "generic"), DotIsa(4, "generic4"), DotIsa(4, "generic4s"), DotIsa(2, "pmaddwd")]
# activation quantizations: u8 with a zero point, i8 symmetric, i8 over -128..127 with
# a zero point (a pre-quantized graph's range), u8 narrowed to 0..127
ACTS = [{"dtype": "u8", "scale": 0.02, "zero_point": 131},
        {"dtype": "i8", "scale": 0.015, "zero_point": 0},
        {"dtype": "i8", "scale": 0.01, "zero_point": -7, "qmin": -128, "qmax": 127},
        {"dtype": "u8", "scale": 0.03, "zero_point": 60, "qmin": 0, "qmax": 127}]


class _Linears(torch.nn.Module):
    """Matmuls with M = 7 (ragged row blocks), K from 5 to 130 (every tail modulo 2
    and 4) and N not a multiple of a panel."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = torch.nn.Linear(130, 37)
        self.l2 = torch.nn.Linear(37, 64)
        self.l3 = torch.nn.Linear(64, 5)
        self.l4 = torch.nn.Linear(5, 19)
        self.l5 = torch.nn.Linear(19, 18, bias=False)

    def forward(self, x):
        y = torch.relu(self.l2(torch.tanh(self.l1(x))))
        return self.l5(torch.sigmoid(self.l4(self.l3(y))))


class _Convs(torch.nn.Module):
    """GEMM convs: 3x3 over 3 channels (K 27), strided, pointwise (K 16), grouped, 5x5
    and 7x7 outputs (positions ragged against every panel width)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 20, 3, stride=2, padding=1)
        self.c3 = torch.nn.Conv2d(20, 16, 1)
        self.c4 = torch.nn.Conv2d(16, 24, 3, padding=1, groups=2)
        self.c5 = torch.nn.Conv2d(24, 8, 3, bias=False)

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.c5(torch.relu(self.c4(self.c3(y))))


def _int8_module(model, x, acts, seed):
    """model quantized int8_sym, then its weight codes replaced by uniform codes over
    -128..127 and its act_quant by acts (cycled), so every code and range is exercised."""
    module = quantized(_to_ir(model, (x,)), "int8_sym", calibration=((x.numpy(),),))
    rng = np.random.default_rng(seed)
    ops = [op for op in module.main.body.ops if op.attrs.get("act_quant")]
    assert ops
    for i, op in enumerate(ops):
        op.attrs["act_quant"] = dict(acts[i % len(acts)])
        codes = op.operands[1].defining_op.operands[0].defining_op
        new = rng.integers(-128, 128, codes.value.shape).astype(np.int8)
        new.reshape(-1)[:2] = [-128, 127]
        codes.value = new
    return module


def _check(module, x, vector_bits, isa):
    ref = interpreter.run(module, [x])[0]
    got = run_native(module, [x], vector_bits, int8=isa)[0]
    assert got.shape == ref.shape
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= 2e-5, err  # integer products; only the f32 rescale and epilogue round


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: f"{i.dot}")
@pytest.mark.parametrize("vector_bits", [128, 256])
def test_int8_matmul_matches_the_interpreter(isa, vector_bits):
    if isa.dot == "pmaddwd" and vector_bits == 256 and not HOST_AVX2:
        pytest.skip("no AVX2 here")
    x = torch.randn(7, 130, generator=torch.Generator().manual_seed(1))
    for shift in range(len(ACTS)):
        module = _int8_module(_Linears().eval(), x, ACTS[shift:] + ACTS[:shift], seed=shift)
        _check(module, x.numpy(), vector_bits, isa)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: f"{i.dot}")
@pytest.mark.parametrize("vector_bits", [128, 256])
def test_int8_conv_matches_the_interpreter(isa, vector_bits):
    if isa.dot == "pmaddwd" and vector_bits == 256 and not HOST_AVX2:
        pytest.skip("no AVX2 here")
    x = torch.randn(2, 3, 13, 13, generator=torch.Generator().manual_seed(2))
    for shift in range(len(ACTS)):
        module = _int8_module(_Convs().eval(), x, ACTS[shift:] + ACTS[:shift], seed=10 + shift)
        _check(module, x.numpy(), vector_bits, isa)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: f"{i.dot}")
def test_int8_conv_packing_each_panel_before_its_gemm_matches_the_interpreter(isa):
    """20x20 images: the first convs have >= 16 panels, so each work item packs (masked
    vector im2col), quantizes and multiplies its own panel (kernels.conv_schedule)."""
    if isa.dot == "pmaddwd" and not HOST_AVX2:
        pytest.skip("no AVX2 here")
    x = torch.randn(1, 3, 20, 20, generator=torch.Generator().manual_seed(3))
    _check(_int8_module(_Convs().eval(), x, ACTS, seed=20), x.numpy(), 256, isa)


def test_the_int8_dot_product_per_target():
    avx2 = Target("x86_64-unknown-linux-gnu", "znver3", "+avx2,+fma")
    vnni = Target("x86_64-unknown-linux-gnu", "sapphirerapids", "+avx2,+fma,+avxvnni")
    v512 = Target("x86_64-unknown-linux-gnu", "sapphirerapids",
                  "+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512vnni,-prefer-256-bit")
    arm = Target.from_triple("aarch64-unknown-linux-gnu")
    assert int8_dot_isa(avx2, 8) == DotIsa(2, "pmaddwd")
    assert int8_dot_isa(vnni, 8) == DotIsa(4, "vpdpbusd")
    assert int8_dot_isa(v512, 16) == DotIsa(4, "vpdpbusd")
    assert int8_dot_isa(arm, 4) == DotIsa(2, "generic") and int8_dot_isa(None, 8) == DotIsa(2, "generic")
    dotprod = Target.from_triple("aarch64-unknown-linux-gnu", "generic", "+neon,+dotprod")
    assert int8_dot_isa(dotprod, 4) == DotIsa(4, "sdot") and int8_dot_isa(dotprod, 4).signed


@pytest.mark.parametrize("features, want", [("+neon,+dotprod", True), ("+neon", False)])
def test_aarch64_int8_kernels_use_sdot_with_the_dot_product_extension(features, want):
    x = torch.randn(7, 130, generator=torch.Generator().manual_seed(1))
    module = _int8_module(_Linears().eval(), x, ACTS, seed=0)
    target = Target.from_triple("aarch64-unknown-linux-gnu", "generic", features)
    asm = compile_to_asm(generate(plan_for(module, KernelTarget.of(target)), "qa").llvm_ir, target)
    assert any(line.split()[:1] == ["sdot"] and ".16b" in line for line in asm.splitlines()) == want


@pytest.mark.parametrize("features,vector_bits,want,unwanted", [
    ("+avx2,+fma,+avxvnni", 256, "vpdpbusd", "vpmaddwd"),
    ("+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512vnni,-prefer-256-bit", 512, "vpdpbusd", "vpmaddwd"),
    ("+avx2,+fma", 256, "vpmaddwd", "vpdpbusd")])
def test_cross_compiled_int8_kernels_use_the_targets_dot_product(features, vector_bits, want, unwanted):
    x = torch.randn(7, 130, generator=torch.Generator().manual_seed(1))
    module = _int8_module(_Linears().eval(), x, ACTS, seed=0)
    target = Target("x86_64-unknown-linux-gnu", "sapphirerapids" if "vnni" in features else "znver3", features)
    assert target.vector_bits == vector_bits
    asm = compile_to_asm(generate(plan_for(module, KernelTarget.of(target)), "qx").llvm_ir, target)
    assert want in asm and unwanted not in asm
    reg = "zmm" if vector_bits == 512 else "ymm"
    assert any(want in line and reg in line for line in asm.splitlines())
