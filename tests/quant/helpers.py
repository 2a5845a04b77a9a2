"""Shared helpers of the quantization tests: compile a Cuvil module for a chosen vector
width (JIT on this host; LLVM splits wider vectors than the host has), run it."""
from __future__ import annotations

import numpy as np

from cuvil.api import _JitModel
from cuvil.backend.llvm.codegen import generate
from cuvil.backend.llvm.jit import JitEngine
from cuvil.backend.llvm.select import KernelTarget
from cuvil.backend.llvm.target import host_target
from cuvil.options import CompileOptions, Quantization
from cuvil.passes.pipeline import optimise, plan_for


def quantized(module, method: str, **options):
    """Run the compile pipeline with Quantization(method, **options) and no target on
    `module` (in place), verifying after every pass."""
    return optimise(module, CompileOptions(quantization=Quantization(method, **options)), None, verify_each=True)


def run_native(module, arrays, vector_bits: int, int8=None, bf16=None) -> tuple[np.ndarray, ...]:
    """JIT on this host, kernels selected (and memory planned again) for vectors of
    `vector_bits`; `int8` / `bf16` (gemm_dot.DotIsa) pick the int8 / bf16 dot product
    (default generic)."""
    plan_for(module, KernelTarget.of(None, vector_bits, int8, bf16))
    gen = generate(module, "qtest")
    return _JitModel(JitEngine(gen, host_target()), gen, module)(*arrays)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
