"""fuse-epilogues: bias, residual and activation chains into conv2d / matmul `post`."""
from __future__ import annotations

import numpy as np

from cuvil.ir import parse_module, run
from cuvil.passes import FuseEpilogues
from tests.passes.helpers import assert_close, assert_golden, ir

RESNET_BLOCK = """
    func @main(%0: tensor<[1, 4, 8, 8], f32> "x") -> ("y") {
      %1 = cuvil.constant() {name = "w1"} : tensor<[4, 4, 3, 3], f32>
      %2 = cuvil.constant() {name = "b1"} : tensor<[1, 4, 1, 1], f32>
      %3 = cuvil.constant() {name = "w2"} : tensor<[8, 4, 3, 3], f32>
      %4 = cuvil.constant() {name = "b2"} : tensor<[1, 8, 1, 1], f32>
      %5 = cuvil.constant() {name = "wd"} : tensor<[8, 4, 1, 1], f32>
      %6 = cuvil.constant() {name = "bd"} : tensor<[1, 8, 1, 1], f32>
      %7 = cuvil.conv2d(%0, %1) {dilation = [1, 1], groups = 1, pads = [1, 1, 1, 1], stride = [1, 1]} : tensor<[1, 4, 8, 8], f32> loc("block.py:1 in forward")
      %8 = cuvil.add(%7, %2) {} : tensor<[1, 4, 8, 8], f32>
      %9 = cuvil.relu(%8) {} : tensor<[1, 4, 8, 8], f32>
      %10 = cuvil.conv2d(%9, %3) {dilation = [1, 1], groups = 1, pads = [1, 1, 1, 1], stride = [2, 2]} : tensor<[1, 8, 4, 4], f32> loc("block.py:2 in forward")
      %11 = cuvil.add(%10, %4) {} : tensor<[1, 8, 4, 4], f32>
      %12 = cuvil.conv2d(%0, %5) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], stride = [2, 2]} : tensor<[1, 8, 4, 4], f32> loc("block.py:3 in forward")
      %13 = cuvil.add(%12, %6) {} : tensor<[1, 8, 4, 4], f32>
      %14 = cuvil.add(%11, %13) {} : tensor<[1, 8, 4, 4], f32>
      %15 = cuvil.relu(%14) {} : tensor<[1, 8, 4, 4], f32>
      cuvil.return(%15)
    }"""

MATMULS = """
    func @main(%0: tensor<[2, 16, 32], f32> "x", %1: tensor<[2, 16, 8], f32> "y") -> ("a", "b", "c", "d", "e") {
      %2 = cuvil.constant() {name = "w"} : tensor<[32, 8], f32>
      %3 = cuvil.constant() {name = "b"} : tensor<[8], f32>
      %4 = cuvil.matmul(%0, %2) {} : tensor<[2, 16, 8], f32>
      %5 = cuvil.add(%4, %3) {} : tensor<[2, 16, 8], f32>
      %6 = cuvil.gelu(%5) {approximate = "none"} : tensor<[2, 16, 8], f32>
      %7 = cuvil.cast(%6) {dtype = "f16"} : tensor<[2, 16, 8], f16>
      %8 = cuvil.matmul(%0, %2) {} : tensor<[2, 16, 8], f32>
      %9 = cuvil.mul(%8, %8) {} : tensor<[2, 16, 8], f32>
      %10 = cuvil.add(%1, %9) {} : tensor<[2, 16, 8], f32>
      %11 = cuvil.matmul(%0, %2) {} : tensor<[2, 16, 8], f32>
      %12 = cuvil.relu(%11) {} : tensor<[2, 16, 8], f32>
      %13 = cuvil.exp(%11) {} : tensor<[2, 16, 8], f32>
      %14 = cuvil.constant() {name = "row"} : tensor<[1, 32], f32>
      %15 = cuvil.matmul(%14, %2) {} : tensor<[1, 8], f32>
      %16 = cuvil.add(%15, %1) {} : tensor<[2, 16, 8], f32>
      cuvil.return(%7, %10, %12, %13, %16)
    }"""


def _weights(text: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {op.attrs["name"]: rng.standard_normal(op.result.shape).astype(np.float32)
            for op in parse_module(ir(text)).main.body.ops if op.name == "cuvil.constant"}


def _same_results(text: str, module, seed: int) -> None:
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(a.shape).astype(np.float32) for a in module.main.args]
    assert_close(run(module, args), run(parse_module(ir(text), module.weights()), args))


def test_resnet_block_conv_bias_residual_relu():
    # The second conv takes its bias, the downsample branch's result (defined after it,
    # so the fused conv moves down to where the relu was) and the relu; the downsample
    # conv then takes only its bias (its result has a conv as user).
    module = assert_golden(FuseEpilogues(), RESNET_BLOCK, """
        func @main(%0: tensor<[1, 4, 8, 8], f32> "x") -> ("y") {
          %1 = cuvil.constant() {name = "w1"} : tensor<[4, 4, 3, 3], f32>
          %2 = cuvil.constant() {name = "b1"} : tensor<[1, 4, 1, 1], f32>
          %3 = cuvil.constant() {name = "w2"} : tensor<[8, 4, 3, 3], f32>
          %4 = cuvil.constant() {name = "b2"} : tensor<[1, 8, 1, 1], f32>
          %5 = cuvil.constant() {name = "wd"} : tensor<[8, 4, 1, 1], f32>
          %6 = cuvil.constant() {name = "bd"} : tensor<[1, 8, 1, 1], f32>
          %7 = cuvil.conv2d(%0, %1, %2) {dilation = [1, 1], groups = 1, pads = [1, 1, 1, 1], post = [["add", [0, 1], {}], ["relu", [2], {}]], stride = [1, 1]} : tensor<[1, 4, 8, 8], f32> loc("block.py:1 in forward")
          %8 = cuvil.conv2d(%0, %5, %6) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], post = [["add", [0, 1], {}]], stride = [2, 2]} : tensor<[1, 8, 4, 4], f32> loc("block.py:3 in forward")
          %9 = cuvil.conv2d(%7, %3, %4, %8) {dilation = [1, 1], groups = 1, pads = [1, 1, 1, 1], post = [["add", [0, 1], {}], ["add", [3, 2], {}], ["relu", [4], {}]], stride = [2, 2]} : tensor<[1, 8, 4, 4], f32> loc("block.py:2 in forward")
          cuvil.return(%9)
        }""", _weights(RESNET_BLOCK, 0))
    _same_results(RESNET_BLOCK, module, 1)


def test_matmul_epilogues_and_where_they_stop():
    # bias + gelu fuse, the f16 cast does not (dtype changes); mul(r, r) uses the raw
    # result twice and the residual keeps its operand order; a result with two users
    # and an add that broadcasts [1, 8] up to [2, 16, 8] are left alone.
    module = assert_golden(FuseEpilogues(), MATMULS, """
        func @main(%0: tensor<[2, 16, 32], f32> "x", %1: tensor<[2, 16, 8], f32> "y") -> ("a", "b", "c", "d", "e") {
          %2 = cuvil.constant() {name = "w"} : tensor<[32, 8], f32>
          %3 = cuvil.constant() {name = "b"} : tensor<[8], f32>
          %4 = cuvil.matmul(%0, %2, %3) {post = [["add", [0, 1], {}], ["gelu", [2], {approximate = "none"}]]} : tensor<[2, 16, 8], f32>
          %5 = cuvil.cast(%4) {dtype = "f16"} : tensor<[2, 16, 8], f16>
          %6 = cuvil.matmul(%0, %2, %1) {post = [["mul", [0, 0], {}], ["add", [1, 2], {}]]} : tensor<[2, 16, 8], f32>
          %7 = cuvil.matmul(%0, %2) {} : tensor<[2, 16, 8], f32>
          %8 = cuvil.relu(%7) {} : tensor<[2, 16, 8], f32>
          %9 = cuvil.exp(%7) {} : tensor<[2, 16, 8], f32>
          %10 = cuvil.constant() {name = "row"} : tensor<[1, 32], f32>
          %11 = cuvil.matmul(%10, %2) {} : tensor<[1, 8], f32>
          %12 = cuvil.add(%11, %1) {} : tensor<[2, 16, 8], f32>
          cuvil.return(%5, %6, %8, %9, %12)
        }""", _weights(MATMULS, 2))
    _same_results(MATMULS, module, 3)


def test_an_existing_epilogue_grows():
    assert_golden(FuseEpilogues(), """
        func @main(%0: tensor<[1, 2, 4, 4], f32> "x") -> ("y") {
          %1 = cuvil.constant() {name = "w"} : tensor<[3, 2, 1, 1], f32>
          %2 = cuvil.constant() {name = "b"} : tensor<[1, 3, 1, 1], f32>
          %3 = cuvil.conv2d(%0, %1, %2) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], post = [["add", [0, 1], {}]], stride = [1, 1]} : tensor<[1, 3, 4, 4], f32>
          %4 = cuvil.clamp(%3) {max = 6.0, min = 0.0} : tensor<[1, 3, 4, 4], f32>
          %5 = cuvil.mul(%4, %2) {} : tensor<[1, 3, 4, 4], f32>
          cuvil.return(%5)
        }""", """
        func @main(%0: tensor<[1, 2, 4, 4], f32> "x") -> ("y") {
          %1 = cuvil.constant() {name = "w"} : tensor<[3, 2, 1, 1], f32>
          %2 = cuvil.constant() {name = "b"} : tensor<[1, 3, 1, 1], f32>
          %3 = cuvil.conv2d(%0, %1, %2) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], post = [["add", [0, 1], {}], ["clamp", [2], {max = 6.0, min = 0.0}], ["mul", [3, 1], {}]], stride = [1, 1]} : tensor<[1, 3, 4, 4], f32>
          cuvil.return(%3)
        }""")
