"""infer-shapes: result types re-derived from operands, symbolic dims included."""
from __future__ import annotations

import pytest

from cuvil.errors import VerifyError
from cuvil.ir import print_module
from cuvil.passes import InferShapes
from tests.passes.helpers import apply, assert_golden, captured


def test_symbolic_batch_reaches_every_value():
    # The input was given a symbolic batch dim after capture: stale [1, ...] types and a
    # stale dtype (the cast's) are refreshed; the conv's spatial dims are recomputed.
    assert_golden(InferShapes(), """
        func @main(%0: tensor<[batch, 3, 8, 8], f32> "x") -> ("y", "z") {
          %1 = cuvil.constant() {name = "w"} : tensor<[4, 3, 3, 3], f32>
          %2 = cuvil.conv2d(%0, %1) {dilation = [1, 1], groups = 1, pads = [1, 1, 1, 1], stride = [2, 2]} : tensor<[1, 4, 8, 8], f32>
          %3 = cuvil.relu(%2) {} : tensor<[1, 4, 8, 8], f32>
          %4 = cuvil.reduce_mean(%3) {axes = [2, 3], keepdims = false} : tensor<[1, 4], f32>
          %5 = cuvil.cast(%4) {dtype = "f16"} : tensor<[1, 4], f32>
          %6 = cuvil.constant() {name = "b"} : tensor<[4], f32>
          %7 = cuvil.add(%4, %6) {} : tensor<[1, 4], f32>
          cuvil.return(%5, %7)
        }""", """
        func @main(%0: tensor<[batch, 3, 8, 8], f32> "x") -> ("y", "z") {
          %1 = cuvil.constant() {name = "w"} : tensor<[4, 3, 3, 3], f32>
          %2 = cuvil.conv2d(%0, %1) {dilation = [1, 1], groups = 1, pads = [1, 1, 1, 1], stride = [2, 2]} : tensor<[batch, 4, 4, 4], f32>
          %3 = cuvil.relu(%2) {} : tensor<[batch, 4, 4, 4], f32>
          %4 = cuvil.reduce_mean(%3) {axes = [2, 3], keepdims = false} : tensor<[batch, 4], f32>
          %5 = cuvil.cast(%4) {dtype = "f16"} : tensor<[batch, 4], f16>
          %6 = cuvil.constant() {name = "b"} : tensor<[4], f32>
          %7 = cuvil.add(%4, %6) {} : tensor<[batch, 4], f32>
          cuvil.return(%5, %7)
        }""", verify_before=False)


def test_correct_types_are_left_alone():
    module = captured("resnet18")
    before = print_module(module)
    InferShapes().apply(module)
    assert print_module(module) == before


def test_a_rule_violation_names_the_op_and_its_source():
    with pytest.raises(VerifyError, match=r"op 1 \(cuvil\.matmul, net\.py:7 in forward\).*contraction"):
        apply(InferShapes(), """
            func @main(%0: tensor<[batch, 3], f32> "x") -> ("y") {
              %1 = cuvil.constant() {name = "w"} : tensor<[4, 5], f32>
              %2 = cuvil.matmul(%0, %1) {} : tensor<[batch, 5], f32> loc("net.py:7 in forward")
              cuvil.return(%2)
            }""", verify_before=False)
