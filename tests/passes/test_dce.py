"""dce: unused ops and constants go, whole chains at once; inputs and outputs stay."""
from __future__ import annotations

from cuvil.passes import DeadCodeElimination
from tests.passes.helpers import assert_golden


def test_dead_chains_and_unused_constants_are_removed():
    assert_golden(DeadCodeElimination(), """
        func @main(%0: tensor<[4], f32> "x", %1: tensor<[4], f32> "unused") -> ("y", "x") {
          %2 = cuvil.constant() {name = "w"} : tensor<[4], f32>
          %3 = cuvil.constant() {name = "dead"} : tensor<[4], f32>
          %4 = cuvil.mul(%0, %3) {} : tensor<[4], f32>
          %5 = cuvil.exp(%4) {} : tensor<[4], f32>
          %6 = cuvil.add(%0, %2) {} : tensor<[4], f32>
          %7 = cuvil.relu(%6) {} : tensor<[4], f32>
          %8 = cuvil.neg(%6) {} : tensor<[4], f32>
          cuvil.return(%7, %0)
        }""", """
        func @main(%0: tensor<[4], f32> "x", %1: tensor<[4], f32> "unused") -> ("y", "x") {
          %2 = cuvil.constant() {name = "w"} : tensor<[4], f32>
          %3 = cuvil.add(%0, %2) {} : tensor<[4], f32>
          %4 = cuvil.relu(%3) {} : tensor<[4], f32>
          cuvil.return(%4, %0)
        }""")
