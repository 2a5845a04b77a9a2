"""Targets: what code is generated for, resolved in one place, and the target machine,
the O3 pipeline and object emission.

A `Target` is the (triple, cpu, features) triple that the toolchain config names, with
the values kernels derive from it: vector width and lanes, masked vector access, the
int8 and bf16 dot products. `resolve_target` turns a Cuvil target name (`host`,
`x86_64-linux-gnu`, `aarch64-linux-gnu`, `wasm32-wasi`) and an optional cpu / feature
string into a `Target`. Everything that makes machine code goes through
`make_target_machine`, so the triple, cpu and features are always explicit: nothing is
taken from the host by accident (the host is only used by `host_target`, on purpose).

LLVM is imported on first use, so the name tables here cost nothing to read (the
config schema lists `TARGET_NAMES`).
"""

from __future__ import annotations

import dataclasses
import functools

from cuvil.errors import BackendError, CuvilError

# Cuvil target names (config `target.arch`, `--target`, the Bazel toolchains) -> LLVM
# triples. `host` is this machine: the x86_64 triple with the host's cpu and features.
TARGET_TRIPLES = {
    "x86_64-linux-gnu": "x86_64-unknown-linux-gnu",
    "aarch64-linux-gnu": "aarch64-unknown-linux-gnu",
    "wasm32-wasi": "wasm32-unknown-wasi",
}
HOST = "host"
HOST_TARGET = "x86_64-linux-gnu"  # what `host` names (the only host Cuvil supports)
TARGET_NAMES = (HOST, *TARGET_TRIPLES)

# Per architecture: (cpu, features) used when `Target.from_triple` is given none.
_ARCH_DEFAULTS = {
    "x86_64": ("x86-64", "+sse2"),
    "aarch64": ("generic", "+neon"),
    "wasm32": ("generic", "+simd128"),
}

# Features that kernels need spelled out (vector width) for x86_64 CPU names given
# without features; LLVM itself knows each CPU's full feature set.
_AVX2 = "+avx,+avx2,+fma,+f16c,+bmi,+bmi2"
_AVX512 = _AVX2 + ",+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512cd,-prefer-256-bit"
X86_CPU_FEATURES = {
    "x86-64": "+sse2", "x86-64-v2": "+sse4.2,+popcnt", "x86-64-v3": _AVX2, "x86-64-v4": _AVX512,
    "haswell": _AVX2, "skylake": _AVX2, "znver2": _AVX2, "znver3": _AVX2, "alderlake": _AVX2,
    "skylake-avx512": _AVX512, "cascadelake": _AVX512, "icelake-server": _AVX512,
    "sapphirerapids": _AVX512, "znver4": _AVX512,
}


def _llvm():
    import llvmlite.binding as llvm
    return llvm


@functools.cache
def initialize() -> None:
    """Register every LLVM target and asm printer once (later calls do nothing).

    llvmlite 0.50 only ships the *native* asm parser, so module-level inline asm
    can be assembled for the host architecture only (see `weights.py`).
    """
    llvm = _llvm()
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_asmparser()


@dataclasses.dataclass(frozen=True)
class DotIsa:
    """How the int8 or bf16 dot products are computed: `group` (G, the consecutive k
    one instruction reduces) and `dot`, one of "pmaddwd" (x86 SSE2/AVX2/AVX-512BW),
    "vpdpbusd" (x86 AVX-VNNI / AVX512-VNNI), "sdot" (AArch64 +dotprod: signed
    activation codes), "generic" (G = 2 in plain IR), "generic4" and "generic4s" (G = 4
    in plain IR: the VNNI / sdot layouts on any target, for tests); for bfloat16,
    "dpbf16ps" (x86 AVX-512-BF16) or "bf16" (no bf16 dot product: the f32 GEMMs on bf16
    operands)."""
    group: int = 2
    dot: str = "generic"

    @property
    def signed(self) -> bool:
        """G = 4 with i8 activation codes (sdot) rather than u8 ones (vpdpbusd)."""
        return self.dot in ("sdot", "generic4s")

    @property
    def bf16(self) -> bool:
        """bfloat16 codes and f32 accumulators (no rescale)."""
        return self.dot in ("dpbf16ps", "bf16")


GENERIC_INT8 = DotIsa(2, "generic")
GENERIC_BF16 = DotIsa(2, "bf16")


def lanes_of(vector_bits: int) -> int:
    """f32 (or i32) lanes of a vector of `vector_bits`; at least 1 (scalar code)."""
    return max(vector_bits // 32, 1)


def masked_lanes(lanes: int) -> bool:
    """Whether kernels on vectors of `lanes` f32 lanes may use masked loads and stores:
    256- and 512-bit vectors, which only x86 targets (AVX, AVX-512) have here; narrower
    targets would scalarise them."""
    return lanes >= 8


def int8_dot_isa(target: Target | None, lanes: int) -> DotIsa:
    """The best exact int8 dot product of `target` for vectors of `lanes` i32 lanes
    (generic without a target). `Target.int8_dot` is this at the target's own lanes."""
    if target is not None and target.arch == "aarch64":
        return DotIsa(4, "sdot") if target.has_feature("dotprod") and lanes % 4 == 0 else GENERIC_INT8
    if target is None or target.arch != "x86_64":
        return GENERIC_INT8
    f = target.has_feature
    if lanes >= 16:
        if f("avx512vnni"):
            return DotIsa(4, "vpdpbusd")
        return DotIsa(2, "pmaddwd") if f("avx512bw") else GENERIC_INT8
    if lanes == 8:
        if f("avxvnni") or (f("avx512vnni") and f("avx512vl")):
            return DotIsa(4, "vpdpbusd")
        return DotIsa(2, "pmaddwd") if f("avx2") else GENERIC_INT8
    return DotIsa(2, "pmaddwd") if lanes == 4 else GENERIC_INT8


def bf16_dot_isa(target: Target | None, lanes: int) -> DotIsa:
    """The bfloat16 dot product of `target` for vectors of `lanes` f32 lanes (generic
    without a target). `Target.bf16_dot` is this at the target's own lanes."""
    if target is None or target.arch != "x86_64" or not target.has_feature("avx512bf16"):
        return GENERIC_BF16
    if lanes == 16 or (lanes == 8 and target.has_feature("avx512vl")):
        return DotIsa(2, "dpbf16ps")
    return GENERIC_BF16


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

    @property
    def lanes(self) -> int:
        """f32 lanes of a vector (`vector_bits // 32`, at least 1)."""
        return lanes_of(self.vector_bits)

    @property
    def masked(self) -> bool:
        """Whether kernels may use masked vector loads and stores (`masked_lanes`)."""
        return masked_lanes(self.lanes)

    @property
    def int8_dot(self) -> DotIsa:
        """The int8 dot product of this target's vectors (`int8_dot_isa`)."""
        return int8_dot_isa(self, self.lanes)

    @property
    def bf16_dot(self) -> DotIsa:
        """The bfloat16 dot product of this target's vectors (`bf16_dot_isa`)."""
        return bf16_dot_isa(self, self.lanes)


def resolve_target(name: str = HOST, cpu: str = "", features: str = "") -> Target:
    """The target for a Cuvil target name and an optional cpu / feature string.

    `host` without cpu or features is this machine (its CPU and features, the x86_64
    triple); otherwise `host` means x86_64-linux-gnu. A named target takes the arch's
    baseline for what is not given; an x86_64 CPU name without features takes the
    features `X86_CPU_FEATURES` lists for it (kernels pick their vector width from
    them). wasm32-wasi is single-threaded, so +atomics is refused."""
    if name == HOST and not (cpu or features):
        host = host_target()
        if not host.triple.startswith("x86_64"):
            raise CuvilError(f"the host {host.triple} is not a supported target")
        return Target(TARGET_TRIPLES[HOST_TARGET], host.cpu, host.features)
    name = HOST_TARGET if name == HOST else name
    if name not in TARGET_TRIPLES:
        raise CuvilError(f"target {name!r} is not supported (supported: {', '.join(TARGET_NAMES)})")
    if name == "x86_64-linux-gnu" and cpu and not features:
        if cpu not in X86_CPU_FEATURES:
            raise CuvilError(f"target.cpu {cpu!r}: give target.features too (e.g. +avx2,+fma); CPUs known without "
                             f"features: {', '.join(sorted(X86_CPU_FEATURES))}")
        features = X86_CPU_FEATURES[cpu]
    target = Target.from_triple(TARGET_TRIPLES[name], cpu, features)
    if target.is_wasm and target.has_feature("atomics"):
        raise CuvilError("wasm32-wasi is single-threaded in Cuvil: remove +atomics from target.features")
    return target


def host_target() -> Target:
    """The machine this process runs on, with its CPU features spelled out.

    LLVM names this host's CPU oddly ("rocketlake" on a Sapphire Rapids-class
    Xeon), so the feature string is the explicit list LLVM detected rather than
    what the CPU name implies. Where AVX-512 is present the CPU name's
    "prefer 256-bit vectors" tuning is turned off, so loops vectorise to zmm.
    """
    llvm = _llvm()
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
    llvm = _llvm()
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
    llvm = _llvm()
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
    llvm = _llvm()
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
