"""The compile-stage pipeline: every pass, in order, in one list."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..errors import CuvilError, VerifyError
from ..ir import Module, verify
from . import Pass
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


def default_pipeline(**options) -> list[Pass]:
    """The passes in order. Each option is named after a pass (snake_case: `memory_plan`)
    and is a dict of that pass's fields, or False to leave the pass out:
    `default_pipeline(memory_plan={"scratch": f}, fuse_elementwise=False)`."""
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
        MemoryPlan(),            # arena offsets for all intermediates (liveness, aliases, in place)
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
