"""In-process JIT of a generated module (for tests and quick experiments).

The deployed path links an object into a library; this one hands the same LLVM IR to
MCJIT in the running process, with the weights blob in a NumPy buffer bound to the
weights symbol. Same IR (but for the weights symbol's visibility), same pipeline, same target.
"""
from __future__ import annotations

import ctypes
import re

import llvmlite.binding as llvm
import numpy as np

from ...errors import BackendError
from .codegen import Generated
from .target import Target, host_target, make_target_machine, optimize


class JitEngine:
    """Owns the execution engine and the weights buffer for as long as it lives."""

    def __init__(self, gen: Generated, target: Target | None = None):
        target = target or host_target()
        if target.triple.split("-")[0] != host_target().triple.split("-")[0]:
            raise BackendError(f"cannot JIT {target.triple} code on this host")
        tm = make_target_machine(target, jit=True)
        # The deployed object reaches its hidden weights symbol PC-relatively; a JIT'd
        # buffer may be farther than 2 GiB away, so here the symbol gets default
        # visibility (an indirect, GOT-relative reference). Nothing else changes.
        decl = re.compile(rf'^(@"?{gen.prefix}_weights"? = external) hidden (constant)', re.M)
        text, n = decl.subn(r"\1 \2", gen.llvm_ir, count=1)
        if n != 1:
            raise BackendError("weights declaration not found in the generated IR")
        try:
            mod = llvm.parse_assembly(text)
            mod.verify()
        except RuntimeError as e:
            raise BackendError(f"generated LLVM IR is invalid: {e}") from e
        mod.triple = target.triple
        mod.data_layout = str(tm.target_data)
        optimize(mod, tm)
        raw = np.zeros(len(gen.weights) + 64, np.uint8)
        start = (-raw.ctypes.data) % 64
        self.weights = raw[start:start + len(gen.weights)]
        self.weights[:] = np.frombuffer(gen.weights, np.uint8)
        llvm.add_symbol(f"{gen.prefix}_weights", self.weights.ctypes.data)
        self.engine = llvm.create_mcjit_compiler(mod, tm)
        self.engine.finalize_object()
        addr = self.engine.get_function_address(f"{gen.prefix}_forward")
        if not addr:
            raise BackendError(f"JIT did not produce {gen.prefix}_forward")
        # A module with symbolic dims takes their values as a fourth argument (i64*).
        n_args = 4 if gen.symbols else 3
        self.forward = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * n_args)(addr)
