"""backend/llvm/target.py: target names resolved in one place, and the values kernels
derive from a Target (vector width, lanes, masking, the int8 and bf16 dot products)."""
from __future__ import annotations

import pytest

from cuvil.backend.llvm.target import (GENERIC_BF16, GENERIC_INT8, TARGET_NAMES, DotIsa, Target, bf16_dot_isa,
                                       host_target, int8_dot_isa, resolve_target)
from cuvil.errors import CuvilError

X86 = "x86_64-unknown-linux-gnu"
AVX2 = Target(X86, "znver3", "+avx2,+fma")
AVX_VNNI = Target(X86, "sapphirerapids", "+avx2,+fma,+avxvnni")
AVX512 = Target(X86, "sapphirerapids", "+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512vnni,+avx512bf16,"
                "-prefer-256-bit")
AVX512_256 = Target(X86, "skylake-avx512", "+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+prefer-256-bit")
SSE = Target.from_triple(X86)
ARM = Target.from_triple("aarch64-unknown-linux-gnu")
ARM_DOT = Target.from_triple("aarch64-unknown-linux-gnu", "generic", "+neon,+dotprod")
WASM = Target.from_triple("wasm32-unknown-wasi")


@pytest.mark.parametrize("target, bits, lanes, masked", [
    (AVX512, 512, 16, True), (AVX512_256, 256, 8, True), (AVX2, 256, 8, True), (SSE, 128, 4, False),
    (ARM, 128, 4, False), (WASM, 128, 4, False), (Target(X86, "x86-64", "-sse2"), 128, 4, False),
])
def test_vector_width_lanes_and_masking(target, bits, lanes, masked):
    assert (target.vector_bits, target.lanes, target.masked) == (bits, lanes, masked)


@pytest.mark.parametrize("target, int8, bf16", [
    (AVX512, DotIsa(4, "vpdpbusd"), DotIsa(2, "dpbf16ps")),
    (AVX512_256, DotIsa(2, "pmaddwd"), GENERIC_BF16),         # no VNNI, no AVX-512-BF16
    (AVX_VNNI, DotIsa(4, "vpdpbusd"), GENERIC_BF16),
    (AVX2, DotIsa(2, "pmaddwd"), GENERIC_BF16),
    (SSE, DotIsa(2, "pmaddwd"), GENERIC_BF16),
    (ARM, GENERIC_INT8, GENERIC_BF16),
    (ARM_DOT, DotIsa(4, "sdot"), GENERIC_BF16),
    (WASM, GENERIC_INT8, GENERIC_BF16),
])
def test_the_dot_products_per_target(target, int8, bf16):
    assert target.int8_dot == int8 and target.bf16_dot == bf16
    assert int8_dot_isa(target, target.lanes) == int8 and bf16_dot_isa(target, target.lanes) == bf16
    assert target.int8_dot.signed == (int8.dot == "sdot") and target.bf16_dot.bf16


def test_dot_products_at_other_widths_and_without_a_target():
    """Kernels may be generated narrower than the target's vectors (tests, fallbacks)."""
    assert int8_dot_isa(AVX512, 8) == DotIsa(4, "vpdpbusd")   # +avx512vl: VNNI on ymm
    assert int8_dot_isa(AVX512_256, 16) == DotIsa(2, "pmaddwd")   # AVX-512BW at 512 bits
    assert int8_dot_isa(AVX2, 16) == GENERIC_INT8 and int8_dot_isa(AVX2, 2) == GENERIC_INT8
    assert bf16_dot_isa(AVX512, 8) == DotIsa(2, "dpbf16ps") and bf16_dot_isa(AVX512, 4) == GENERIC_BF16
    assert int8_dot_isa(ARM_DOT, 2) == GENERIC_INT8
    assert int8_dot_isa(None, 8) == GENERIC_INT8 and bf16_dot_isa(None, 16) == GENERIC_BF16


@pytest.mark.parametrize("name, cpu, features, want", [
    ("x86_64-linux-gnu", "", "", Target(X86, "x86-64", "+sse2")),
    ("host", "x86-64-v3", "", Target(X86, "x86-64-v3", "+avx,+avx2,+fma,+f16c,+bmi,+bmi2")),
    ("x86_64-linux-gnu", "haswell", "+avx2", Target(X86, "haswell", "+avx2")),
    ("aarch64-linux-gnu", "", "", Target("aarch64-unknown-linux-gnu", "generic", "+neon")),
    ("wasm32-wasi", "", "-simd128", Target("wasm32-unknown-wasi", "generic", "-simd128")),
])
def test_resolve_target(name, cpu, features, want):
    assert resolve_target(name, cpu, features) == want


def test_resolve_host_and_errors():
    host = resolve_target()
    assert host.triple == X86 and (host.cpu, host.features) == (host_target().cpu, host_target().features)
    assert resolve_target("x86_64-linux-gnu", "skylake-avx512").vector_bits == 512
    assert TARGET_NAMES == ("host", "x86_64-linux-gnu", "aarch64-linux-gnu", "wasm32-wasi")
    with pytest.raises(CuvilError, match=r"target 'riscv64' is not supported \(supported: host, x86_64-linux-gnu"):
        resolve_target("riscv64")
    with pytest.raises(CuvilError, match="target.cpu 'pentium-pro-max': give target.features too"):
        resolve_target("x86_64-linux-gnu", "pentium-pro-max")
    with pytest.raises(CuvilError, match="single-threaded"):
        resolve_target("wasm32-wasi", "", "+simd128,+atomics")
