"""Shared helpers of the quantization tests: compile a Cuvil module for a chosen vector
width (JIT on this host; LLVM splits wider vectors than the host has), run it."""
from __future__ import annotations

import numpy as np

from cuvil.api import _JitModel
from cuvil.backend.llvm.codegen import generate
from cuvil.backend.llvm.jit import JitEngine
from cuvil.backend.llvm.target import host_target
from cuvil.options import CompileOptions, Quantization
from cuvil.passes.pipeline import optimise


def quantized(module, method: str, **options):
    """Run the compile pipeline with Quantization(method, **options) and no target on
    `module` (in place), verifying after every pass."""
    return optimise(module, CompileOptions(quantization=Quantization(method, **options)), None, verify_each=True)


def run_native(module, arrays, vector_bits: int, int8=None, bf16=None) -> tuple[np.ndarray, ...]:
    """JIT on this host; `int8` / `bf16` (qgemm8.Int8Isa) pick the int8 / bf16 dot
    product (default generic)."""
    gen = generate(module, "qtest", vector_bits, int8=int8, bf16=bf16)
    return _JitModel(JitEngine(gen, host_target()), gen, module)(*arrays)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
