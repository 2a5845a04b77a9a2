"""memory-plan: arena offsets, aliases, in-place reuse, scratch; check_plan; arena use
on real models."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil.errors import CuvilError
from cuvil.ir import Builder, Function, Module, TensorType, run, verify
from cuvil.passes import FuseElementwise, FuseEpilogues, MemoryPlan, check_plan, default_pipeline, run_pipeline
from tests.passes.helpers import apply, assert_golden, run_in_arena

PLANNED = """
    func @main(%0: tensor<[1, 16], f32> "x") -> ("y", "z") {
      %1 = cuvil.constant() {name = "w"} : tensor<[16, 16], f32>
      %2 = cuvil.matmul(%0, %1) {kernel_plan = {scratch = 100}} : tensor<[1, 16], f32>
      %3 = cuvil.reshape(%2) {shape = [4, 4]} : tensor<[4, 4], f32>
      %4 = cuvil.transpose(%3) {perm = [1, 0]} : tensor<[4, 4], f32>
      %5 = cuvil.fused(%4) {program = [["exp", [0], {}]]} : tensor<[4, 4], f32>
      %6 = cuvil.fused(%5, %3) {program = [["add", [0, 1], {}]]} : tensor<[4, 4], f32>
      %7 = cuvil.reshape(%6) {shape = [1, 16]} : tensor<[1, 16], f32>
      %8 = cuvil.reshape(%0) {shape = [4, 4]} : tensor<[4, 4], f32>
      %9 = cuvil.matmul(%8, %8) {kernel_plan = {scratch = 100}} : tensor<[4, 4], f32>
      cuvil.return(%7, %9)
    }"""
WEIGHTS = {"w": np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)}


def _planned(**fields):
    return apply(MemoryPlan(**fields), PLANNED, WEIGHTS)


def test_offsets_aliases_in_place_and_scratch():
    # %3 aliases %2 (offset 128), which so lives until %6 reads %3; %5 and %6 overwrite
    # their dying [4, 4] operand in place (offset 0, reused after %2's scratch); %7 and
    # %9 are returned (no offset); the reshape of the input %8 is a copy in the arena.
    # The matmuls' plans ask for 100 scratch bytes: rounded up to 128, live only during them.
    module = assert_golden(MemoryPlan(), PLANNED, """
        func @main(%0: tensor<[1, 16], f32> "x") -> ("y", "z") attributes {arena_size = 192, intermediate_bytes = 320} {
          %1 = cuvil.constant() {name = "w"} : tensor<[16, 16], f32>
          %2 = cuvil.matmul(%0, %1) {arena_offset = 128, kernel_plan = {scratch = 100}, scratch_bytes = 128, scratch_offset = 0} : tensor<[1, 16], f32>
          %3 = cuvil.reshape(%2) {alias = true, arena_offset = 128, shape = [4, 4]} : tensor<[4, 4], f32>
          %4 = cuvil.transpose(%3) {arena_offset = 0, perm = [1, 0]} : tensor<[4, 4], f32>
          %5 = cuvil.fused(%4) {arena_offset = 0, program = [["exp", [0], {}]]} : tensor<[4, 4], f32>
          %6 = cuvil.fused(%5, %3) {arena_offset = 0, program = [["add", [0, 1], {}]]} : tensor<[4, 4], f32>
          %7 = cuvil.reshape(%6) {shape = [1, 16]} : tensor<[1, 16], f32>
          %8 = cuvil.reshape(%0) {arena_offset = 128, shape = [4, 4]} : tensor<[4, 4], f32>
          %9 = cuvil.matmul(%8, %8) {kernel_plan = {scratch = 100}, scratch_bytes = 128, scratch_offset = 0} : tensor<[4, 4], f32>
          cuvil.return(%7, %9)
        }""", WEIGHTS)
    check_plan(module.main)
    x = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)
    for got, want in zip(run_in_arena(module, [x]), run(module, [x])):
        np.testing.assert_array_equal(got, want)


def test_without_in_place_each_fused_result_gets_its_own_place():
    module = _planned(in_place=False)
    offsets = [op.attrs.get("arena_offset") for op in module.main.body.ops]
    assert offsets[3] != offsets[4] != offsets[5]  # (%4 and %6 may share: %4 is dead by then)
    check_plan(module.main)


@pytest.mark.parametrize("op_index, offset", [(3, 128), (7, 0)])
def test_check_plan_and_the_arena_run_catch_overlaps(op_index, offset):
    # op 3 at 128 would overwrite %2 while its alias %3 is still to be read; op 7 at 0
    # would sit in the scratch of the matmul that reads it.
    module = _planned()
    module.main.body.ops[op_index].attrs["arena_offset"] = offset
    with pytest.raises(AssertionError, match="overlap"):
        check_plan(module.main)
    x = np.random.default_rng(2).standard_normal((1, 16)).astype(np.float32)
    assert not all(np.array_equal(a, b) for a, b in zip(run_in_arena(module, [x]), run(module, [x])))


def test_check_plan_rejects_in_place_over_a_live_operand():
    module = _planned(in_place=False)
    ops = module.main.body.ops
    ops[4].attrs["arena_offset"] = ops[3].attrs["arena_offset"]  # %5 over %4: fine, %4 dies at %5
    check_plan(module.main)
    ops[5].attrs["arena_offset"] = ops[1].attrs["arena_offset"]  # %6 over %2 as %2 (read as %3) dies: fine
    check_plan(module.main)
    ops[5].attrs["arena_offset"] = ops[4].attrs["arena_offset"]
    ops[4].attrs["arena_offset"] = ops[1].attrs["arena_offset"]  # %5 over %2 while %3 is still to be read
    with pytest.raises(AssertionError, match="overlap"):
        check_plan(module.main)


def test_unbounded_symbolic_shapes_are_an_error():
    with pytest.raises(CuvilError, match="bounds for the symbolic dim.* n: cuvil.relu"):
        apply(MemoryPlan(), """
            func @main(%0: tensor<[n, 4], f32> "x") -> ("y") {
              %1 = cuvil.relu(%0) {} : tensor<[n, 4], f32>
              %2 = cuvil.neg(%1) {} : tensor<[n, 4], f32>
              cuvil.return(%2)
            }""")


def test_symbolic_shapes_are_planned_at_their_upper_bounds():
    m = apply(MemoryPlan(), """
        func @main(%0: tensor<[n, 4], f32> "x") -> ("y") attributes {dim_bounds = {n = [1, 10]}} {
          %1 = cuvil.relu(%0) {} : tensor<[n, 4], f32>
          %2 = cuvil.reshape(%1) {shape = ["4*n"]} : tensor<[4*n], f32>
          %3 = cuvil.neg(%2) {} : tensor<[4*n], f32>
          %4 = cuvil.exp(%3) {} : tensor<[4*n], f32>
          cuvil.return(%4)
        }""")
    fn = m.main
    assert fn.attrs["arena_size"] >= 2 * 10 * 4 * 4  # relu's and neg's results, both at n = 10
    assert fn.attrs["intermediate_bytes"] == 2 * 10 * 4 * 4
    check_plan(fn)


# -- random programs ------------------------------------------------------------------------------
_RESHAPES = {32: [(4, 8), (8, 4), (32,), (2, 16)], 16: [(4, 4), (16,), (2, 8)]}


@st.composite
def programs(draw):
    """A random function of elementwise ops, reshapes, transposes, matmuls (some fed by
    bias/activation chains) and reductions over 32- and 16-element tensors."""
    fn = Function("main", ["x", "y"], [TensorType((4, 8)), TensorType((4, 8))])
    b = Builder(fn.body)
    vals = list(fn.args)
    w = b.constant(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    for _ in range(draw(st.integers(4, 20))):
        x = draw(st.sampled_from(vals))
        kind = draw(st.sampled_from(["unary", "binary", "reshape", "transpose", "matmul", "reduce"]))
        if kind == "unary":
            vals.append(b.op(draw(st.sampled_from(["cuvil.tanh", "cuvil.neg", "cuvil.relu", "cuvil.sigmoid"])), x))
        elif kind == "binary":
            y = draw(st.sampled_from([v for v in vals if v.shape == x.shape]))
            vals.append(b.op(draw(st.sampled_from(["cuvil.add", "cuvil.mul", "cuvil.maximum"])), x, y))
        elif kind == "reshape" and x.type.numel in _RESHAPES:
            vals.append(b.op("cuvil.reshape", x, shape=list(draw(st.sampled_from(_RESHAPES[x.type.numel])))))
        elif kind == "transpose" and x.type.rank == 2:
            vals.append(b.op("cuvil.transpose", x, perm=[1, 0]))
        elif kind == "matmul" and x.shape == (4, 8):
            vals.append(b.op("cuvil.matmul", x, w))
        elif kind == "reduce" and x.type.rank == 2:
            vals.append(b.op("cuvil.reduce_sum", x, axes=[1], keepdims=True))
    outs = draw(st.lists(st.sampled_from(vals), min_size=1, max_size=3))
    fn.output_names = [f"out{i}" for i in range(len(outs))]
    b.op_multi("cuvil.return", *outs)
    module = Module()
    module.add(fn)
    verify(module)
    return module


@settings(max_examples=60)
@given(programs(), st.booleans())
def test_random_programs_run_correctly_from_the_arena(module, in_place):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2)]
    want = run(module, xs)
    for op in module.main.body.ops:  # kernel plans asking for scratch
        if op.name in ("cuvil.transpose", "cuvil.matmul"):
            op.attrs["kernel_plan"] = {"scratch": 96}
    run_pipeline(module, [FuseEpilogues(), FuseElementwise(), MemoryPlan(in_place=in_place)], verify_each=True)
    check_plan(module.main)
    for got, ref in zip(run_in_arena(module, xs), want):
        np.testing.assert_array_equal(got, ref)


# -- real models ----------------------------------------------------------------------------------
def _big_models():
    from examples.models import bert, mobilenet_v2, resnet
    return {
        "resnet50@224": (resnet.resnet50(), resnet.example_inputs(size=224)),
        "mobilenet_v2@224": (mobilenet_v2.mobilenet_v2(), mobilenet_v2.example_inputs(size=224)),
        "bert@seq64": (bert.BertEncoder(bert.BertConfig()), bert.example_inputs(seq=64)),
    }


@pytest.mark.parametrize("name, max_ratio", [("resnet50@224", 0.2), ("mobilenet_v2@224", 0.3),
                                             ("bert@seq64", 0.15)])
def test_arena_is_much_smaller_than_all_intermediates(name, max_ratio):
    from cuvil.frontends.torch import capture_torch
    model, inputs = _big_models()[name]
    module = capture_torch(model.eval(), inputs)
    run_pipeline(module, default_pipeline())
    check_plan(module.main)
    arena, total = module.main.attrs["arena_size"], module.main.attrs["intermediate_bytes"]
    print(f"{name}: arena {arena / 2**20:.2f} MiB, intermediates {total / 2**20:.2f} MiB")
    assert arena <= max_ratio * total
