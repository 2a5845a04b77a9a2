"""The pipeline: its order and options, and the whole of it on captured models (valid IR
and same results after every pass; what the models look like at the end)."""
from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from cuvil.errors import CuvilError, VerifyError
from cuvil.ir import Module, print_module, run, verify
from cuvil.ir.ops import ELEMENTWISE
from cuvil.passes import MemoryPlan, check_plan, default_pipeline, run_pipeline
from tests.passes.helpers import MODELS, assert_close, captured, random_inputs, reference, run_in_arena

ORDER = ["infer-shapes", "canonicalize", "fold-fake-quant", "constant-fold", "fold-batch-norm", "dce", "fuse-epilogues",
         "fuse-elementwise", "fuse-attention", "quantize-weights", "select-kernels", "memory-plan", "select-storage"]


def test_default_order_and_pass_form():
    passes = default_pipeline()
    assert [p.name for p in passes] == ORDER
    for p in passes:
        assert dataclasses.is_dataclass(p) and p.__dataclass_params__.frozen


def test_options_set_fields_and_drop_passes():
    passes = default_pipeline(memory_plan={"in_place": False}, fuse_elementwise=False)
    assert [p.name for p in passes] == [n for n in ORDER if n != "fuse-elementwise"]
    assert passes[-2] == MemoryPlan(in_place=False)
    with pytest.raises(CuvilError, match="unknown pipeline option.*fuse_everything"):
        default_pipeline(fuse_everything=True)
    with pytest.raises(CuvilError, match="constant_fold"):
        default_pipeline(constant_fold={"max_megabytes": 1})


@dataclasses.dataclass(frozen=True)
class _Breaks:
    name = "breaks-types"

    def apply(self, module: Module) -> None:
        op = next(op for op in module.main.body.ops if op.name == "cuvil.conv2d")
        op.result.type = op.result.type.with_dtype("f16")


def test_verify_each_names_the_pass_that_broke_the_ir():
    module = captured("unet")
    with pytest.raises(VerifyError, match="after pass breaks-types"):
        run_pipeline(module, [default_pipeline()[0], _Breaks()], verify_each=True)


def _programs(module) -> Counter:
    """(op, its program's instruction names, operand count) of each anchor and fused op."""
    out = Counter()
    for op in module.main.body.ops:
        if op.name in ("cuvil.conv2d", "cuvil.matmul", "cuvil.fused", "cuvil.attention"):
            program = op.attrs.get("post") or op.attrs.get("program") or []
            out[(op.name, " ".join(i[0] for i in program), len(op.operands))] += 1
    return out


@pytest.mark.parametrize("model", list(MODELS))
def test_whole_pipeline_step_by_step(model):
    module, inputs, ref = captured(model), random_inputs(model, 1), reference(model, 1)
    for p in default_pipeline():
        p.apply(module)
        verify(module)
        got = run_in_arena(module, inputs) if p.name == "memory-plan" else run(module, inputs)
        assert_close(got, ref, f"{model} after {p.name}")
    names = Counter(op.name for op in module.main.body.ops)
    assert names["cuvil.batch_norm"] == 0
    assert not any(n in ELEMENTWISE for n in names), names
    check_plan(module.main)
    assert module.main.attrs["arena_size"] <= module.main.attrs["intermediate_bytes"]


# What the named example models become: every batch norm is gone into a conv, each conv
# or linear layer carries its bias, activation and residual add.
EXPECTED = {
    "resnet18": {
        ("cuvil.conv2d", "add relu", 3): 9,       # stem and first conv of each block
        ("cuvil.conv2d", "add add relu", 4): 8,   # second conv: bias, residual, relu
        ("cuvil.conv2d", "add", 3): 3,            # downsample convs
        ("cuvil.matmul", "add", 3): 1,            # fc
    },
    "mobilenet_v2": {
        ("cuvil.conv2d", "add clamp", 3): 35,     # expand / depthwise + ReLU6
        ("cuvil.conv2d", "add add", 4): 10,       # projection + residual
        ("cuvil.conv2d", "add", 3): 7,            # projection without residual
        ("cuvil.matmul", "", 2): 1,               # classifier (zero bias: add(x, 0) is gone)
    },
    "bert": {
        ("cuvil.matmul", "add", 3): 12,           # q, k, v projections
        ("cuvil.matmul", "mul add", 4): 4,        # scores * scale + mask
        ("cuvil.matmul", "", 2): 4,               # probs @ v (score matrices this small are not fused)
        ("cuvil.matmul", "add add", 4): 8,        # output projections + residual
        ("cuvil.matmul", "add gelu", 3): 4,       # feed-forward in
        ("cuvil.fused", "add", 2): 1,             # embeddings: tokens + (positions + types folded)
        ("cuvil.fused", "cast sub mul", 3): 1,    # the additive mask from the 0/1 mask
    },
}


@pytest.mark.parametrize("model", list(EXPECTED))
def test_example_models_end_up_fused(model):
    module = run_pipeline(captured(model))
    assert _programs(module) == EXPECTED[model]
    first = next(op for op in module.main.body.ops if op.name in ("cuvil.conv2d", "cuvil.matmul"))
    if model != "bert":
        assert first.attrs["post"][0] == ["add", [0, 1], {}]


def test_output_is_deterministic_and_a_second_run_changes_nothing():
    a, b = run_pipeline(captured("resnet18")), run_pipeline(captured("resnet18"))
    text = print_module(a)
    assert text == print_module(b)
    wa, wb = a.weights(), b.weights()
    assert list(wa) == list(wb) and all(np.array_equal(wa[k], wb[k]) for k in wa)
    run_pipeline(a, verify_each=True)
    assert print_module(a) == text


def test_compile_passes_follow_the_options_and_the_target():
    """The one pipeline function (cuvil.compile, build, inspect, quant-report): the
    quantization reaches its passes, fuse drops fuse-epilogues, a target reaches the
    passes that depend on one."""
    from cuvil.backend.llvm.target import resolve_target
    from cuvil.options import CompileOptions, Quantization
    from cuvil.passes.pipeline import compile_passes

    def by_name(passes):
        return {p.name: p for p in passes}

    plain = by_name(compile_passes(CompileOptions(), None))
    defaults = by_name(default_pipeline())
    assert list(plain) == list(defaults)
    assert plain["quantize-weights"] == defaults["quantize-weights"]
    assert plain["fold-fake-quant"] == defaults["fold-fake-quant"]
    assert plain == by_name(compile_passes(CompileOptions(), None))
    avx512 = resolve_target("x86_64-linux-gnu", "x86-64-v4")
    assert by_name(compile_passes(CompileOptions(), avx512)) != plain
    assert "fuse-epilogues" not in by_name(compile_passes(CompileOptions(fuse=False), avx512))
    calib = [(np.zeros((1, 4), np.float32),)]
    q = Quantization("int8_sym", calibration=calib, activation="i8", ranges="percentile", percentile=99.5, keep_f32=1)
    weights = by_name(compile_passes(CompileOptions(quantization=q), None, report=True))["quantize-weights"]
    assert (weights.method, weights.activation, weights.ranges, weights.percentile, weights.keep_f32, weights.report) \
        == ("int8_sym", "i8", "percentile", 99.5, 1, True)
    assert weights.calibration[0][0] is q.calibration[0][0]
    qat = by_name(compile_passes(CompileOptions(quantization=Quantization("int8_sym", qat=True, activation="u8")),
                                 None, report=True))
    assert qat["quantize-weights"].method == "none" and not qat["quantize-weights"].report
    assert (qat["fold-fake-quant"].required, qat["fold-fake-quant"].activation) == (True, "u8")
    bf16 = by_name(compile_passes(CompileOptions(quantization=Quantization(precision="bf16")), None))
    assert (bf16["quantize-weights"].method, bf16["quantize-weights"].precision) == ("none", "bf16")
