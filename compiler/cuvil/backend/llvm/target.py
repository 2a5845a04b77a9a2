"""Targets, the target machine, the O3 pipeline and object emission.

A `Target` is the (triple, cpu, features) triple that the toolchain config names.
Everything that makes machine code goes through `make_target_machine`, so the
triple, cpu and features are always explicit: nothing is taken from the host by
accident (the host is only used by `host_target`, on purpose).
"""

from __future__ import annotations

import dataclasses
import functools

import llvmlite.binding as llvm

from cuvil.errors import BackendError

# Per architecture: (cpu, features) used when `Target.from_triple` is given none.
_ARCH_DEFAULTS = {
    "x86_64": ("x86-64", "+sse2"),
    "aarch64": ("generic", "+neon"),
    "wasm32": ("generic", "+simd128"),
}


@functools.cache
def initialize() -> None:
    """Register every LLVM target and asm printer once (later calls do nothing).

    llvmlite 0.50 only ships the *native* asm parser, so module-level inline asm
    can be assembled for the host architecture only (see `weights.py`).
    """
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_asmparser()


@dataclasses.dataclass(frozen=True)
class Target:
    """What to generate code for: an LLVM triple, a CPU name and a feature string."""

    triple: str
    cpu: str = ""
    features: str = ""

    @classmethod
    def from_triple(cls, triple: str, cpu: str = "", features: str = "") -> Target:
        """A target for `triple`; an empty cpu/features takes the arch's baseline.

        Baselines: x86_64 -> x86-64 (+sse2), aarch64 -> generic (+neon),
        wasm32 -> generic (+simd128).
        """
        arch = triple.split("-", 1)[0]
        if arch not in _ARCH_DEFAULTS:
            raise BackendError(
                f"unsupported target triple {triple!r}: the architecture must be one "
                f"of {sorted(_ARCH_DEFAULTS)}"
            )
        default_cpu, default_features = _ARCH_DEFAULTS[arch]
        return cls(triple, cpu or default_cpu, features or default_features)

    @property
    def arch(self) -> str:
        return self.triple.split("-", 1)[0]

    @property
    def is_wasm(self) -> bool:
        return self.arch.startswith("wasm")

    def has_feature(self, name: str) -> bool:
        """True when `+name` is in the feature string (the last mention wins)."""
        enabled = False
        for item in self.features.split(","):
            if item[1:] == name:
                enabled = item[0] == "+"
        return enabled

    @property
    def vector_bits(self) -> int:
        """Float SIMD width for kernels, read from the feature string alone.

        Features the CPU name implies are not consulted, so name them (as
        `host_target` does).
        """
        if self.arch == "x86_64":
            avx512 = self.has_feature("avx512f")
            if avx512 and not self.has_feature("prefer-256-bit"):
                return 512
            return 256 if avx512 or self.has_feature("avx2") or self.has_feature("avx") else 128
        return 128  # NEON and wasm simd128 (and scalar code fits in it too).


def host_target() -> Target:
    """The machine this process runs on, with its CPU features spelled out.

    LLVM names this host's CPU oddly ("rocketlake" on a Sapphire Rapids-class
    Xeon), so the feature string is the explicit list LLVM detected rather than
    what the CPU name implies. Where AVX-512 is present the CPU name's
    "prefer 256-bit vectors" tuning is turned off, so loops vectorise to zmm.
    """
    initialize()
    triple = llvm.get_process_triple()
    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" in features.split(","):
        features += ",-prefer-256-bit"
    return Target(triple, llvm.get_host_cpu_name(), features)


def make_target_machine(target: Target, opt: int = 3, jit: bool = False) -> llvm.TargetMachine:
    """The one place a TargetMachine is made: default code model; PIC for ELF.
    `jit=True` uses the large code model: MCJIT may place code and data sections more
    than 2 GiB apart, beyond the reach of the small model's 32-bit relocations.

    wasm32 is static: PIC there means emscripten-style dynamic linking, which a
    plain wasm-ld link of a WASI module does not do.
    """
    initialize()
    try:
        llvm_target = llvm.Target.from_triple(target.triple)
    except RuntimeError as exc:
        raise BackendError(f"LLVM does not know target triple {target.triple!r}: {exc}") from exc
    return llvm_target.create_target_machine(
        cpu=target.cpu,
        features=target.features,
        opt=opt,
        reloc="static" if target.is_wasm else "pic",
        codemodel="large" if jit else "default",
    )


def optimize(module: llvm.ModuleRef, tm: llvm.TargetMachine, level: int = 3) -> None:
    """Run LLVM's default per-module pipeline (new pass manager) in place.

    PipelineTuningOptions starts with SLP vectorisation *off* (as in LLVM's
    C++ API; clang turns it on for -O2/-O3), so loop and SLP vectorisation,
    interleaving and unrolling are all set explicitly here.
    """
    pto = llvm.create_pipeline_tuning_options(speed_level=level)
    vectorize = level >= 2
    pto.loop_vectorization = vectorize
    pto.slp_vectorization = vectorize
    pto.loop_interleaving = vectorize
    pto.loop_unrolling = level >= 1
    builder = llvm.create_pass_builder(tm, pto)
    builder.getModulePassManager().run(module, builder)


def _prepare(llvm_ir_text: str, target: Target, opt: int) -> tuple[llvm.ModuleRef, llvm.TargetMachine]:
    """Parse and verify the IR, stamp the target on it and optimise it."""
    tm = make_target_machine(target, opt)
    try:
        module = llvm.parse_assembly(llvm_ir_text)
        module.verify()
    except RuntimeError as exc:
        raise BackendError(f"generated LLVM IR is invalid: {exc}") from exc
    module.triple = target.triple
    module.data_layout = str(tm.target_data)
    optimize(module, tm, opt)
    return module, tm


def optimized_ir(llvm_ir_text: str, target: Target, opt: int = 3) -> str:
    """The IR after the optimisation pipeline (for tests and debugging)."""
    module, _ = _prepare(llvm_ir_text, target, opt)
    return str(module)


def compile_to_object(llvm_ir_text: str, target: Target, opt: int = 3) -> bytes:
    """IR text -> optimised relocatable object file (ELF or wasm) bytes.

    Deterministic: the same text and target give the same bytes.
    """
    module, tm = _prepare(llvm_ir_text, target, opt)
    try:
        return tm.emit_object(module)
    except RuntimeError as exc:
        raise BackendError(f"LLVM failed to emit an object for {target.triple}: {exc}") from exc


def compile_to_asm(llvm_ir_text: str, target: Target, opt: int = 3) -> str:
    """IR text -> optimised assembly text, for reading generated code."""
    module, tm = _prepare(llvm_ir_text, target, opt)
    return tm.emit_assembly(module)
