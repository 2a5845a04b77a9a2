"""constant-fold: ops on constants become constants named fold.<n>; big results are
not materialised."""
from __future__ import annotations

import numpy as np

from cuvil.ir import print_module
from cuvil.passes import ConstantFold
from tests.passes.helpers import apply, assert_golden, const

BEFORE = """
    func @main(%0: tensor<[2, 4], f32> "x") -> ("y", "z", "s") {
      %1 = cuvil.constant() {name = "w"} : tensor<[3, 4], f32>
      %2 = cuvil.constant() {name = "fold.1"} : tensor<[3], f32>
      %3 = cuvil.transpose(%1) {perm = [1, 0]} : tensor<[4, 3], f32> loc("net.py:2 in forward")
      %4 = cuvil.matmul(%0, %3) {} : tensor<[2, 3], f32>
      %5 = cuvil.reshape(%2) {shape = [1, 3]} : tensor<[1, 3], f32>
      %6 = cuvil.mul(%5, %5) {} : tensor<[1, 3], f32>
      %7 = cuvil.add(%4, %6) {} : tensor<[2, 3], f32>
      %8 = cuvil.constant() {name = "s"} : tensor<[1], f32>
      %9 = cuvil.broadcast_to(%8) {shape = [512, 1024]} : tensor<[512, 1024], f32>
      %10 = cuvil.broadcast_to(%8) {shape = [4, 4]} : tensor<[4, 4], f32>
      cuvil.return(%7, %9, %10)
    }"""
WEIGHTS = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "fold.1": np.array([1, 2, 3], np.float32),
           "s": np.full(1, 7, np.float32)}


def test_folds_chains_names_freshly_and_skips_large_broadcasts():
    # The transpose, the reshape and the mul of the reshape fold (fold.1 is taken, so
    # numbering starts at 2; the dead fold.3 is left for dce); the 2 MiB broadcast of a
    # 4-byte scalar stays an op, the 64-byte one folds.
    module = assert_golden(ConstantFold(), BEFORE, """
        func @main(%0: tensor<[2, 4], f32> "x") -> ("y", "z", "s") {
          %1 = cuvil.constant() {name = "w"} : tensor<[3, 4], f32>
          %2 = cuvil.constant() {name = "fold.1"} : tensor<[3], f32>
          %3 = cuvil.constant() {name = "fold.2"} : tensor<[4, 3], f32> loc("net.py:2 in forward")
          %4 = cuvil.matmul(%0, %3) {} : tensor<[2, 3], f32>
          %5 = cuvil.constant() {name = "fold.3"} : tensor<[1, 3], f32>
          %6 = cuvil.constant() {name = "fold.4"} : tensor<[1, 3], f32>
          %7 = cuvil.add(%4, %6) {} : tensor<[2, 3], f32>
          %8 = cuvil.constant() {name = "s"} : tensor<[1], f32>
          %9 = cuvil.broadcast_to(%8) {shape = [512, 1024]} : tensor<[512, 1024], f32>
          %10 = cuvil.constant() {name = "fold.5"} : tensor<[4, 4], f32>
          cuvil.return(%7, %9, %10)
        }""", WEIGHTS)
    np.testing.assert_array_equal(const(module, "fold.2"), WEIGHTS["w"].T)
    np.testing.assert_array_equal(const(module, "fold.4"), [[1, 4, 9]])
    np.testing.assert_array_equal(const(module, "fold.5"), np.full((4, 4), 7, np.float32))


def test_size_limit_is_an_option():
    module = apply(ConstantFold(max_bytes=4 << 20), BEFORE, WEIGHTS)
    assert not any(op.name == "cuvil.broadcast_to" for op in module.main.body.ops)
    module = apply(ConstantFold(max_bytes=0, max_growth=1.0), BEFORE, WEIGHTS)
    kinds = [op.name for op in module.main.body.ops]
    assert kinds.count("cuvil.broadcast_to") == 2 and "cuvil.transpose" not in kinds


def test_names_are_deterministic():
    a, b = apply(ConstantFold(), BEFORE, WEIGHTS), apply(ConstantFold(), BEFORE, WEIGHTS)
    assert print_module(a) == print_module(b)


def test_an_op_whose_reference_fails_is_left_for_run_time():
    text = """
        func @main(%0: tensor<[2], f32> "x") -> ("y") {
          %1 = cuvil.constant() {name = "table"} : tensor<[3, 2], f32>
          %2 = cuvil.constant() {name = "idx"} : tensor<[1], i64>
          %3 = cuvil.gather(%1, %2) {axis = 0} : tensor<[1, 2], f32>
          %4 = cuvil.add(%0, %3) {} : tensor<[1, 2], f32>
          cuvil.return(%4)
        }"""
    assert_golden(ConstantFold(), text, text, {"table": np.zeros((3, 2), np.float32), "idx": np.array([5])})
