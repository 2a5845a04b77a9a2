"""The compile-stage pipeline: every pass, in order, in one list (`default_pipeline`),
and the one function that runs it for a compilation (`optimise`): `cuvil.compile`,
`cuvil build` / `cuvil compile`, `cuvil inspect` and `cuvil quant-report` all call it."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol, Sequence

from ..backend.llvm.select import KernelTarget, SelectKernels, SelectStorage, kernel_passes
from ..errors import CuvilError, VerifyError
from ..ir import Module, verify
from ..options import CALIBRATED, CalibrationFiles, CompileOptions
from .canonicalize import Canonicalize
from .constant_fold import ConstantFold
from .dce import DeadCodeElimination
from .fold_batch_norm import FoldBatchNorm
from .fold_fake_quant import FoldFakeQuant
from .fuse_attention import FuseAttention
from .fuse_elementwise import FuseElementwise
from .fuse_epilogues import FuseEpilogues
from .infer_shapes import InferShapes
from .memory_plan import MemoryPlan
from .quantize_weights import QuantizeWeights

if TYPE_CHECKING:
    from ..backend.llvm.target import Target


class Pass(Protocol):
    """A pass: a frozen dataclass with a kebab-case `name` whose `apply` rewrites the
    module in place and leaves it valid; its fields are its options."""
    name: str

    def apply(self, module: Module) -> None: ...


def default_pipeline(**options) -> list[Pass]:
    """The passes in order. Each option is named after a pass (snake_case: `memory_plan`)
    and is a dict of that pass's fields, or False to leave the pass out:
    `default_pipeline(memory_plan={"in_place": False}, fuse_elementwise=False)`. The
    kernel selection passes do nothing without a target: `**kernel_passes(target)`."""
    passes: list[Pass] = [
        InferShapes(),           # re-derive every result type (symbolic dims flow through)
        Canonicalize(),          # batch_norm -> mul + add; drop no-op casts/reshapes; sub/div by constants
        FoldFakeQuant(),         # a pre-quantized graph's int8 weights + fake-quant activations -> int8 ops
        ConstantFold(),          # evaluate ops on constants (transposed weights, reshaped biases)
        FoldBatchNorm(),         # per-channel scales into conv/matmul weights; merge constant adds
        DeadCodeElimination(),   # drop what the rewrites left unused, old weights included
        FuseEpilogues(),         # bias / residual / activation chains into conv2d and matmul
        FuseElementwise(),       # every other elementwise chain into cuvil.fused loops
        FuseAttention(),         # matmul -> softmax -> matmul: one attention op (no score matrix)
        QuantizeWeights(),       # conv/matmul weights in a narrower type (quantization option)
        SelectKernels(),         # each op's kernel for the target: form, weight layout, scratch, in place
        MemoryPlan(),            # arena offsets for all intermediates (liveness, aliases, in place)
        SelectStorage(),         # results kept as bf16 plane pairs where every reader takes them
    ]
    by_key = {p.name.replace("-", "_"): p for p in passes}
    unknown = sorted(set(options) - set(by_key))
    if unknown:
        raise CuvilError(f"unknown pipeline option(s) {', '.join(unknown)}; passes are {', '.join(by_key)}")
    out = []
    for key, p in by_key.items():
        opt = options.get(key, {})
        if opt is False:
            continue
        try:
            out.append(replace(p, **opt))
        except TypeError as e:
            raise CuvilError(f"pipeline option {key}: {e}") from None
    return out


def run_pipeline(module: Module, passes: Sequence[Pass] | None = None, verify_each: bool = False) -> Module:
    """Apply `passes` (default: `default_pipeline()`) to `module` in place; with
    `verify_each`, verify after every pass and name the pass that broke the IR."""
    for p in default_pipeline() if passes is None else passes:
        p.apply(module)
        if verify_each:
            try:
                verify(module)
            except VerifyError as e:
                raise VerifyError(f"after pass {p.name}: {e}") from None
    return module


def plan_for(module: Module, target: KernelTarget) -> Module:
    """Select kernels and plan memory again for another target (the last three passes of
    the pipeline), unless the module's plans are for it already."""
    fn = module.main
    if fn.attrs.get("kernel_target") is not None and KernelTarget.recorded(fn) == target:
        return module
    return run_pipeline(module, [SelectKernels(target), MemoryPlan(), SelectStorage(target)])


def compile_passes(options: CompileOptions, target: Target | None, report: bool = False) -> list[Pass]:
    """The passes for a compilation with `options` for `target` (None where no target is
    known yet: `cuvil inspect`, `quant-report`; the memory plan then makes no choice
    that depends on one). `report` has int8_sym record every candidate layer.

    The quantization's calibration must be input tuples by now (a config's files are
    loaded by the compile stage, build.optimised_module)."""
    q = options.quantization
    files = isinstance(q.calibration, CalibrationFiles)
    if files and q.has_calibration and q.weights_method in CALIBRATED:
        raise CuvilError("the calibration files must be loaded before the passes run "
                         "(quant_config.calibration_inputs)")
    weights = {"method": q.weights_method, "precision": q.precision}
    if not q.qat:
        weights.update(activation=q.activation or "u8", ranges=q.ranges, percentile=q.percentile,
                       keep_f32=q.keep_f32, calibration=() if files else q.calibration,
                       report=report and q.method == "int8_sym")
    return default_pipeline(
        fold_fake_quant={"required": q.qat, "activation": q.activation if q.qat else ""},
        fuse_epilogues={} if options.fuse else False,
        quantize_weights=weights,
        **(kernel_passes(KernelTarget.of(target)) if target is not None else {}),
    )


def optimise(module: Module, options: CompileOptions | None = None, target: Target | None = None, *,
             report: bool = False, verify_each: bool = False) -> Module:
    """Run the compile stage's passes (`compile_passes`) on `module` in place."""
    return run_pipeline(module, compile_passes(options or CompileOptions(), target, report), verify_each)
