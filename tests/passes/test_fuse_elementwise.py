"""fuse-elementwise: every elementwise op becomes cuvil.fused; single-use chains merge."""
from __future__ import annotations

import numpy as np

from cuvil.ir import parse_module, print_module, run
from cuvil.ir.ops import ELEMENTWISE
from cuvil.passes import FuseElementwise
from tests.passes.helpers import apply, assert_close, assert_golden, ir

CHAINS = """
    func @main(%0: tensor<[2, 8], f32> "x", %1: tensor<[2, 8], f32> "y", %2: tensor<[2, 1], f32> "g") -> ("a", "b", "c") {
      %3 = cuvil.constant() {name = "s"} : tensor<[8], f32>
      %4 = cuvil.mul(%0, %3) {} : tensor<[2, 8], f32>
      %5 = cuvil.add(%4, %0) {} : tensor<[2, 8], f32>
      %6 = cuvil.relu(%5) {} : tensor<[2, 8], f32>
      %7 = cuvil.sigmoid(%2) {} : tensor<[2, 1], f32>
      %8 = cuvil.mul(%6, %7) {} : tensor<[2, 8], f32>
      %9 = cuvil.gt(%1, %0) {} : tensor<[2, 8], bool>
      %10 = cuvil.where(%9, %8, %1) {} : tensor<[2, 8], f32>
      %11 = cuvil.exp(%1) {} : tensor<[2, 8], f32>
      %12 = cuvil.add(%11, %10) {} : tensor<[2, 8], f32>
      %13 = cuvil.softmax(%11) {axis = 1} : tensor<[2, 8], f32>
      cuvil.return(%12, %13, %10)
    }"""
WEIGHTS = {"s": np.linspace(-1, 1, 8, dtype=np.float32)}


def _check_same(module, seed: int) -> None:
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(a.shape).astype(np.float32) for a in module.main.args]
    assert_close(run(module, args), run(parse_module(ir(CHAINS), WEIGHTS), args))


def test_chains_merge_into_one_program_per_multi_use_value():
    # mul -> add -> relu -> mul -> where (with the gt) is one loop over x, y, s and the
    # sigmoid gate; x is read once though used three times. The [2, 1] sigmoid stays a
    # loop of its own (merged it would run for all 16 outputs); where's and exp's results
    # have two users, so they end programs.
    module = assert_golden(FuseElementwise(), CHAINS, """
        func @main(%0: tensor<[2, 8], f32> "x", %1: tensor<[2, 8], f32> "y", %2: tensor<[2, 1], f32> "g") -> ("a", "b", "c") {
          %3 = cuvil.constant() {name = "s"} : tensor<[8], f32>
          %4 = cuvil.fused(%2) {program = [["sigmoid", [0], {}]]} : tensor<[2, 1], f32>
          %5 = cuvil.fused(%1, %0, %3, %4) {program = [["gt", [0, 1], {}], ["mul", [1, 2], {}], ["add", [5, 1], {}], ["relu", [6], {}], ["mul", [7, 3], {}], ["where", [4, 8, 0], {}]]} : tensor<[2, 8], f32>
          %6 = cuvil.fused(%1) {program = [["exp", [0], {}]]} : tensor<[2, 8], f32>
          %7 = cuvil.fused(%6, %5) {program = [["add", [0, 1], {}]]} : tensor<[2, 8], f32>
          %8 = cuvil.softmax(%6) {axis = 1} : tensor<[2, 8], f32>
          cuvil.return(%7, %8, %5)
        }""", WEIGHTS)
    _check_same(module, 0)


def test_merge_broadcast_also_merges_smaller_producers():
    module = assert_golden(FuseElementwise(merge_broadcast=True), CHAINS, """
        func @main(%0: tensor<[2, 8], f32> "x", %1: tensor<[2, 8], f32> "y", %2: tensor<[2, 1], f32> "g") -> ("a", "b", "c") {
          %3 = cuvil.constant() {name = "s"} : tensor<[8], f32>
          %4 = cuvil.fused(%1, %0, %3, %2) {program = [["gt", [0, 1], {}], ["mul", [1, 2], {}], ["add", [5, 1], {}], ["relu", [6], {}], ["sigmoid", [3], {}], ["mul", [7, 8], {}], ["where", [4, 9, 0], {}]]} : tensor<[2, 8], f32>
          %5 = cuvil.fused(%1) {program = [["exp", [0], {}]]} : tensor<[2, 8], f32>
          %6 = cuvil.fused(%5, %4) {program = [["add", [0, 1], {}]]} : tensor<[2, 8], f32>
          %7 = cuvil.softmax(%5) {axis = 1} : tensor<[2, 8], f32>
          cuvil.return(%6, %7, %4)
        }""", WEIGHTS)
    _check_same(module, 1)


def test_idempotent_and_no_bare_elementwise_left():
    module = apply(FuseElementwise(), CHAINS, WEIGHTS)
    assert not any(op.name in ELEMENTWISE for op in module.main.body.ops)
    once = print_module(module)
    FuseElementwise().apply(module)
    assert print_module(module) == once


def test_identical_instructions_are_computed_once():
    assert_golden(FuseElementwise(), """
        func @main(%0: tensor<[4], f32> "x") -> ("y") {
          %1 = cuvil.exp(%0) {} : tensor<[4], f32>
          %2 = cuvil.exp(%0) {} : tensor<[4], f32>
          %3 = cuvil.mul(%1, %2) {} : tensor<[4], f32>
          cuvil.return(%3)
        }""", """
        func @main(%0: tensor<[4], f32> "x") -> ("y") {
          %1 = cuvil.fused(%0) {program = [["exp", [0], {}], ["mul", [1, 1], {}]]} : tensor<[4], f32>
          cuvil.return(%1)
        }""")
