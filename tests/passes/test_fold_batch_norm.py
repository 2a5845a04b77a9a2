"""fold-batch-norm: per-channel scales into conv/matmul weights, biases merged."""
from __future__ import annotations

import numpy as np

from cuvil.ir import parse_module, run
from cuvil.passes import FoldBatchNorm
from tests.passes.helpers import assert_close, assert_golden, const, ir

FOLDABLE = """
    func @main(%0: tensor<[1, 2, 4, 4], f32> "x", %1: tensor<[2, 8], f32> "t") -> ("y", "z") {
      %2 = cuvil.constant() {name = "conv.weight"} : tensor<[3, 2, 1, 1], f32>
      %3 = cuvil.constant() {name = "conv.bias"} : tensor<[1, 3, 1, 1], f32>
      %4 = cuvil.constant() {name = "bn.scale"} : tensor<[3, 1, 1], f32>
      %5 = cuvil.constant() {name = "bn.shift"} : tensor<[1, 3, 1, 1], f32>
      %6 = cuvil.conv2d(%0, %2) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], stride = [1, 1]} : tensor<[1, 3, 4, 4], f32> loc("net.py:1 in forward")
      %7 = cuvil.add(%6, %3) {} : tensor<[1, 3, 4, 4], f32>
      %8 = cuvil.mul(%4, %7) {} : tensor<[1, 3, 4, 4], f32>
      %9 = cuvil.add(%8, %5) {} : tensor<[1, 3, 4, 4], f32>
      %10 = cuvil.constant() {name = "fc.weight"} : tensor<[8, 5], f32>
      %11 = cuvil.constant() {name = "fc.scale"} : tensor<[5], f32>
      %12 = cuvil.constant() {name = "fc.shift"} : tensor<[1, 5], f32>
      %13 = cuvil.matmul(%1, %10) {} : tensor<[2, 5], f32> loc("net.py:2 in forward")
      %14 = cuvil.mul(%13, %11) {} : tensor<[2, 5], f32>
      %15 = cuvil.add(%14, %12) {} : tensor<[2, 5], f32>
      cuvil.return(%9, %15)
    }"""


def _weights(text: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {op.attrs["name"]: rng.standard_normal(op.result.shape).astype(np.float32)
            for op in parse_module(ir(text)).main.body.ops if op.name == "cuvil.constant"}


def test_conv_and_matmul_absorb_their_scales():
    # conv -> add(bias) -> mul(scale on the left, [3, 1, 1]) -> add(shift) becomes a conv
    # with scaled weights and one add of bias * scale + shift; the matmul's weight
    # columns absorb a [5] scale.
    weights = _weights(FOLDABLE)
    module = assert_golden(FoldBatchNorm(), FOLDABLE, """
        func @main(%0: tensor<[1, 2, 4, 4], f32> "x", %1: tensor<[2, 8], f32> "t") -> ("y", "z") {
          %2 = cuvil.constant() {name = "bn.scale"} : tensor<[3, 1, 1], f32>
          %3 = cuvil.constant() {name = "bn.shift"} : tensor<[1, 3, 1, 1], f32>
          %4 = cuvil.constant() {name = "conv.weight.folded"} : tensor<[3, 2, 1, 1], f32> loc("net.py:1 in forward")
          %5 = cuvil.conv2d(%0, %4) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], stride = [1, 1]} : tensor<[1, 3, 4, 4], f32> loc("net.py:1 in forward")
          %6 = cuvil.constant() {name = "conv.bias.scaled.merged"} : tensor<[1, 3, 1, 1], f32>
          %7 = cuvil.add(%5, %6) {} : tensor<[1, 3, 4, 4], f32>
          %8 = cuvil.constant() {name = "fc.scale"} : tensor<[5], f32>
          %9 = cuvil.constant() {name = "fc.shift"} : tensor<[1, 5], f32>
          %10 = cuvil.constant() {name = "fc.weight.folded"} : tensor<[8, 5], f32> loc("net.py:2 in forward")
          %11 = cuvil.matmul(%1, %10) {} : tensor<[2, 5], f32> loc("net.py:2 in forward")
          %12 = cuvil.add(%11, %9) {} : tensor<[2, 5], f32>
          cuvil.return(%7, %12)
        }""", weights)
    s = weights["bn.scale"].reshape(3)
    np.testing.assert_allclose(const(module, "conv.weight.folded"), weights["conv.weight"] * s[:, None, None, None],
                               rtol=1e-6)
    np.testing.assert_allclose(const(module, "conv.bias.scaled.merged").reshape(3),
                               weights["conv.bias"].reshape(3) * s + weights["bn.shift"].reshape(3), rtol=1e-6)
    np.testing.assert_allclose(const(module, "fc.weight.folded"), weights["fc.weight"] * weights["fc.scale"], rtol=1e-6)
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((1, 2, 4, 4)).astype(np.float32), rng.standard_normal((2, 8)).astype(np.float32)]
    assert_close(run(module, args), run(parse_module(ir(FOLDABLE), weights), args))


def test_what_does_not_fold():
    # %4 has a second user (the return); %7's scale varies per pixel; the conv %9 already
    # has an epilogue; c1 + c2 would be [2, 2], larger than either part; a * b merges
    # (and a, now unused, goes with the inner mul).
    text = """
        func @main(%0: tensor<[1, 2, 4, 4], f32> "x", %1: tensor<[2, 2], f32> "v") -> ("a", "b", "c", "d", "e", "f") {
          %2 = cuvil.constant() {name = "w"} : tensor<[3, 2, 1, 1], f32>
          %3 = cuvil.constant() {name = "per_channel"} : tensor<[1, 3, 1, 1], f32>
          %4 = cuvil.conv2d(%0, %2) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], stride = [1, 1]} : tensor<[1, 3, 4, 4], f32>
          %5 = cuvil.mul(%4, %3) {} : tensor<[1, 3, 4, 4], f32>
          %6 = cuvil.constant() {name = "per_pixel"} : tensor<[1, 1, 4, 4], f32>
          %7 = cuvil.conv2d(%0, %2) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], stride = [1, 1]} : tensor<[1, 3, 4, 4], f32>
          %8 = cuvil.mul(%7, %6) {} : tensor<[1, 3, 4, 4], f32>
          %9 = cuvil.conv2d(%0, %2) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], post = [["relu", [0], {}]], stride = [1, 1]} : tensor<[1, 3, 4, 4], f32>
          %10 = cuvil.mul(%9, %3) {} : tensor<[1, 3, 4, 4], f32>
          %11 = cuvil.constant() {name = "c1"} : tensor<[2, 1], f32>
          %12 = cuvil.constant() {name = "c2"} : tensor<[1, 2], f32>
          %13 = cuvil.add(%1, %11) {} : tensor<[2, 2], f32>
          %14 = cuvil.add(%13, %12) {} : tensor<[2, 2], f32>
          %15 = cuvil.constant() {name = "a"} : tensor<[2], f32>
          %16 = cuvil.constant() {name = "b"} : tensor<[2], f32>
          %17 = cuvil.mul(%1, %15) {} : tensor<[2, 2], f32>
          %18 = cuvil.mul(%16, %17) {} : tensor<[2, 2], f32>
          cuvil.return(%4, %5, %8, %10, %14, %18)
        }"""
    weights = _weights(text, 2)
    module = assert_golden(FoldBatchNorm(), text, """
        func @main(%0: tensor<[1, 2, 4, 4], f32> "x", %1: tensor<[2, 2], f32> "v") -> ("a", "b", "c", "d", "e", "f") {
          %2 = cuvil.constant() {name = "w"} : tensor<[3, 2, 1, 1], f32>
          %3 = cuvil.constant() {name = "per_channel"} : tensor<[1, 3, 1, 1], f32>
          %4 = cuvil.conv2d(%0, %2) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], stride = [1, 1]} : tensor<[1, 3, 4, 4], f32>
          %5 = cuvil.mul(%4, %3) {} : tensor<[1, 3, 4, 4], f32>
          %6 = cuvil.constant() {name = "per_pixel"} : tensor<[1, 1, 4, 4], f32>
          %7 = cuvil.conv2d(%0, %2) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], stride = [1, 1]} : tensor<[1, 3, 4, 4], f32>
          %8 = cuvil.mul(%7, %6) {} : tensor<[1, 3, 4, 4], f32>
          %9 = cuvil.conv2d(%0, %2) {dilation = [1, 1], groups = 1, pads = [0, 0, 0, 0], post = [["relu", [0], {}]], stride = [1, 1]} : tensor<[1, 3, 4, 4], f32>
          %10 = cuvil.mul(%9, %3) {} : tensor<[1, 3, 4, 4], f32>
          %11 = cuvil.constant() {name = "c1"} : tensor<[2, 1], f32>
          %12 = cuvil.constant() {name = "c2"} : tensor<[1, 2], f32>
          %13 = cuvil.add(%1, %11) {} : tensor<[2, 2], f32>
          %14 = cuvil.add(%13, %12) {} : tensor<[2, 2], f32>
          %15 = cuvil.constant() {name = "b"} : tensor<[2], f32>
          %16 = cuvil.constant() {name = "a.merged"} : tensor<[2], f32>
          %17 = cuvil.mul(%1, %16) {} : tensor<[2, 2], f32>
          cuvil.return(%4, %5, %8, %10, %14, %17)
        }""", weights)
    np.testing.assert_allclose(const(module, "a.merged"), weights["a"] * weights["b"], rtol=1e-6)


def test_grouped_conv_scales_each_output_channel():
    text = """
        func @main(%0: tensor<[1, 4, 5, 5], f32> "x") -> ("y") {
          %1 = cuvil.constant() {name = "w"} : tensor<[4, 1, 3, 3], f32>
          %2 = cuvil.constant() {name = "s"} : tensor<[1, 4, 1, 1], f32>
          %3 = cuvil.conv2d(%0, %1) {dilation = [1, 1], groups = 4, pads = [1, 1, 1, 1], stride = [2, 2]} : tensor<[1, 4, 3, 3], f32>
          %4 = cuvil.mul(%3, %2) {} : tensor<[1, 4, 3, 3], f32>
          cuvil.return(%4)
        }"""
    weights = _weights(text, 3)
    module = parse_module(ir(text), weights)
    FoldBatchNorm().apply(module)
    assert [op.name for op in module.main.body.ops] == ["cuvil.constant", "cuvil.constant", "cuvil.conv2d", "cuvil.return"]
    x = np.random.default_rng(4).standard_normal((1, 4, 5, 5)).astype(np.float32)
    assert_close(run(module, [x]), run(parse_module(ir(text), weights), [x]))
