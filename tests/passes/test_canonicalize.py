"""canonicalize: batch norm to mul + add, no-op removal, reshape/transpose chains,
sub/div by constants, constants to the right, strided 1x1 convs to slice + conv."""
from __future__ import annotations

import numpy as np

from cuvil.ir import parse_module, run
from cuvil.passes import Canonicalize
from tests.passes.helpers import apply, assert_close, assert_golden, const, ir

BN_CONST = """
    func @main(%0: tensor<[1, 2, 3, 3], f32> "x") -> ("y") {
      %1 = cuvil.constant() {name = "bn.running_mean"} : tensor<[2], f32>
      %2 = cuvil.constant() {name = "bn.running_var"} : tensor<[2], f32>
      %3 = cuvil.constant() {name = "bn.weight"} : tensor<[2], f32>
      %4 = cuvil.constant() {name = "bn.bias"} : tensor<[2], f32>
      %5 = cuvil.batch_norm(%0, %1, %2, %3, %4) {eps = 1e-05} : tensor<[1, 2, 3, 3], f32> loc("net.py:4 in forward")
      cuvil.return(%5)
    }"""
BN_WEIGHTS = {"bn.running_mean": np.array([0.5, -1], np.float32), "bn.running_var": np.array([4, 0.25], np.float32),
              "bn.weight": np.array([2, 3], np.float32), "bn.bias": np.array([1, 0], np.float32)}


def test_batch_norm_with_constant_parameters_becomes_mul_add_of_new_constants():
    module = assert_golden(Canonicalize(), BN_CONST, """
        func @main(%0: tensor<[1, 2, 3, 3], f32> "x") -> ("y") {
          %1 = cuvil.constant() {name = "bn.running_mean"} : tensor<[2], f32>
          %2 = cuvil.constant() {name = "bn.running_var"} : tensor<[2], f32>
          %3 = cuvil.constant() {name = "bn.weight"} : tensor<[2], f32>
          %4 = cuvil.constant() {name = "bn.bias"} : tensor<[2], f32>
          %5 = cuvil.constant() {name = "bn.scale"} : tensor<[1, 2, 1, 1], f32> loc("net.py:4 in forward")
          %6 = cuvil.constant() {name = "bn.shift"} : tensor<[1, 2, 1, 1], f32> loc("net.py:4 in forward")
          %7 = cuvil.mul(%0, %5) {} : tensor<[1, 2, 3, 3], f32> loc("net.py:4 in forward")
          %8 = cuvil.add(%7, %6) {} : tensor<[1, 2, 3, 3], f32> loc("net.py:4 in forward")
          cuvil.return(%8)
        }""", BN_WEIGHTS)
    scale = np.array([2 / np.sqrt(4 + 1e-5), 3 / np.sqrt(0.25 + 1e-5)])
    np.testing.assert_allclose(const(module, "bn.scale").reshape(2), scale, rtol=1e-7)
    np.testing.assert_allclose(const(module, "bn.shift").reshape(2), [1 - 0.5 * scale[0], 0 + 1 * scale[1]], rtol=1e-7)
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 3)).astype(np.float32)
    assert_close(run(module, [x]), run(parse_module(ir(BN_CONST), BN_WEIGHTS), [x]))


def test_batch_norm_with_runtime_parameters_becomes_ops():
    before = """
        func @main(%0: tensor<[2, 3], f32> "x", %1: tensor<[3], f32> "mean", %2: tensor<[3], f32> "var", %3: tensor<[3], f32> "w", %4: tensor<[3], f32> "b") -> ("y") {
          %5 = cuvil.batch_norm(%0, %1, %2, %3, %4) {eps = 0.001} : tensor<[2, 3], f32>
          cuvil.return(%5)
        }"""
    module = assert_golden(Canonicalize(), before, """
        func @main(%0: tensor<[2, 3], f32> "x", %1: tensor<[3], f32> "mean", %2: tensor<[3], f32> "var", %3: tensor<[3], f32> "w", %4: tensor<[3], f32> "b") -> ("y") {
          %5 = cuvil.constant() {name = "bn.eps.1"} : tensor<[1], f32>
          %6 = cuvil.add(%2, %5) {} : tensor<[3], f32>
          %7 = cuvil.rsqrt(%6) {} : tensor<[3], f32>
          %8 = cuvil.mul(%3, %7) {} : tensor<[3], f32>
          %9 = cuvil.mul(%1, %8) {} : tensor<[3], f32>
          %10 = cuvil.sub(%4, %9) {} : tensor<[3], f32>
          %11 = cuvil.reshape(%8) {shape = [1, 3]} : tensor<[1, 3], f32>
          %12 = cuvil.reshape(%10) {shape = [1, 3]} : tensor<[1, 3], f32>
          %13 = cuvil.mul(%0, %11) {} : tensor<[2, 3], f32>
          %14 = cuvil.add(%13, %12) {} : tensor<[2, 3], f32>
          cuvil.return(%14)
        }""")
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(2, 3), (3,), (3,), (3,), (3,)]]
    args[2] = np.abs(args[2]) + 0.5
    assert_close(run(module, args), run(parse_module(ir(before)), args))


def test_no_op_casts_reshapes_transposes_and_chains():
    # %1-%3 do nothing; %4 -> %5 is one reshape; %6 -> %7 one transpose ([1,0,2] then
    # [2,0,1] is [2,1,0]); %8 -> %9 composes to the identity; %10 is then a no-op.
    assert_golden(Canonicalize(), """
        func @main(%0: tensor<[2, 3, 4], f32> "x") -> ("a", "b", "c") {
          %1 = cuvil.cast(%0) {dtype = "f32"} : tensor<[2, 3, 4], f32>
          %2 = cuvil.reshape(%1) {shape = [2, 3, 4]} : tensor<[2, 3, 4], f32>
          %3 = cuvil.transpose(%2) {perm = [0, 1, 2]} : tensor<[2, 3, 4], f32>
          %4 = cuvil.reshape(%3) {shape = [6, 4]} : tensor<[6, 4], f32>
          %5 = cuvil.reshape(%4) {shape = [24]} : tensor<[24], f32>
          %6 = cuvil.transpose(%0) {perm = [1, 0, 2]} : tensor<[3, 2, 4], f32>
          %7 = cuvil.transpose(%6) {perm = [2, 0, 1]} : tensor<[4, 3, 2], f32>
          %8 = cuvil.transpose(%0) {perm = [2, 0, 1]} : tensor<[4, 2, 3], f32>
          %9 = cuvil.transpose(%8) {perm = [1, 2, 0]} : tensor<[2, 3, 4], f32>
          %10 = cuvil.broadcast_to(%9) {shape = [2, 3, 4]} : tensor<[2, 3, 4], f32>
          cuvil.return(%5, %7, %10)
        }""", """
        func @main(%0: tensor<[2, 3, 4], f32> "x") -> ("a", "b", "c") {
          %1 = cuvil.reshape(%0) {shape = [24]} : tensor<[24], f32>
          %2 = cuvil.transpose(%0) {perm = [2, 1, 0]} : tensor<[4, 3, 2], f32>
          cuvil.return(%1, %2, %0)
        }""")


def test_transpose_chain_keeps_its_meaning():
    text = """
        func @main(%0: tensor<[2, 3, 4], f32> "x") -> ("y") {
          %1 = cuvil.transpose(%0) {perm = [1, 0, 2]} : tensor<[3, 2, 4], f32>
          %2 = cuvil.transpose(%1) {perm = [2, 0, 1]} : tensor<[4, 3, 2], f32>
          cuvil.return(%2)
        }"""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    module = parse_module(ir(text))
    Canonicalize().apply(module)
    np.testing.assert_array_equal(run(module, [x])[0], x.transpose(1, 0, 2).transpose(2, 0, 1))


def test_sub_div_by_constants_commuting_and_identities():
    # sub(x, c) -> add(x, -c); div(x, c) -> mul(x, 1/c); add(0, y) -> add(y, 0) -> y;
    # sub(0, y) keeps its order; in f16 only the exact reciprocal (1/2) is used.
    before = """
        func @main(%0: tensor<[2, 3], f32> "x", %1: tensor<[3], f16> "h") -> ("a", "b", "c", "d") {
          %2 = cuvil.constant() {name = "c"} : tensor<[3], f32>
          %3 = cuvil.sub(%0, %2) {} : tensor<[2, 3], f32>
          %4 = cuvil.div(%3, %2) {} : tensor<[2, 3], f32>
          %5 = cuvil.constant() {name = "zero"} : tensor<[1], f32>
          %6 = cuvil.add(%5, %4) {} : tensor<[2, 3], f32>
          %7 = cuvil.sub(%5, %6) {} : tensor<[2, 3], f32>
          %8 = cuvil.constant() {name = "two"} : tensor<[1], f16>
          %9 = cuvil.constant() {name = "three"} : tensor<[1], f16>
          %10 = cuvil.div(%1, %8) {} : tensor<[3], f16>
          %11 = cuvil.div(%10, %9) {} : tensor<[3], f16>
          %12 = cuvil.mul(%9, %1) {} : tensor<[3], f16>
          cuvil.return(%6, %7, %11, %12)
        }"""
    weights = {"c": np.array([1, 2, 4], np.float32), "zero": np.zeros(1, np.float32),
               "two": np.full(1, 2, np.float16), "three": np.full(1, 3, np.float16)}
    module = assert_golden(Canonicalize(), before, """
        func @main(%0: tensor<[2, 3], f32> "x", %1: tensor<[3], f16> "h") -> ("a", "b", "c", "d") {
          %2 = cuvil.constant() {name = "c"} : tensor<[3], f32>
          %3 = cuvil.constant() {name = "c.neg"} : tensor<[3], f32>
          %4 = cuvil.add(%0, %3) {} : tensor<[2, 3], f32>
          %5 = cuvil.constant() {name = "c.recip"} : tensor<[3], f32>
          %6 = cuvil.mul(%4, %5) {} : tensor<[2, 3], f32>
          %7 = cuvil.constant() {name = "zero"} : tensor<[1], f32>
          %8 = cuvil.sub(%7, %6) {} : tensor<[2, 3], f32>
          %9 = cuvil.constant() {name = "two"} : tensor<[1], f16>
          %10 = cuvil.constant() {name = "three"} : tensor<[1], f16>
          %11 = cuvil.constant() {name = "two.recip"} : tensor<[1], f16>
          %12 = cuvil.mul(%1, %11) {} : tensor<[3], f16>
          %13 = cuvil.div(%12, %10) {} : tensor<[3], f16>
          %14 = cuvil.mul(%1, %10) {} : tensor<[3], f16>
          cuvil.return(%6, %8, %13, %14)
        }""", weights)
    np.testing.assert_array_equal(const(module, "c.neg"), [-1, -2, -4])
    np.testing.assert_array_equal(const(module, "c.recip"), [1, 0.5, 0.25])
    rng = np.random.default_rng(2)
    args = [rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float16)]
    assert_close(run(module, args), run(parse_module(ir(before), weights), args))


def test_division_by_zero_is_left_alone():
    text = """
        func @main(%0: tensor<[2], f32> "x") -> ("y") {
          %1 = cuvil.constant() {name = "c"} : tensor<[2], f32>
          %2 = cuvil.div(%0, %1) {} : tensor<[2], f32>
          cuvil.return(%2)
        }"""
    assert_golden(Canonicalize(), text, text, {"c": np.array([2, 0], np.float32)})


STRIDED_1X1 = """
    func @main(%0: tensor<[2, 6, 9, 10], f32> "x") -> ("y") {
      %1 = cuvil.constant() {name = "w"} : tensor<[4, 3, 1, 1], f32>
      %2 = cuvil.conv2d(%0, %1) {stride = [2, 3], pads = [0, 0, 0, 0], dilation = [1, 1], groups = 2} : tensor<[2, 4, 5, 4], f32>
      cuvil.return(%2)
    }"""


def test_strided_1x1_conv_becomes_a_slice_and_a_stride_1_conv():
    weights = {"w": np.random.default_rng(1).standard_normal((4, 3, 1, 1)).astype(np.float32)}
    module = assert_golden(Canonicalize(), STRIDED_1X1, """
        func @main(%0: tensor<[2, 6, 9, 10], f32> "x") -> ("y") {
          %1 = cuvil.constant() {name = "w"} : tensor<[4, 3, 1, 1], f32>
          %2 = cuvil.slice(%0) {ends = [2, 6, 9, 10], starts = [0, 0, 0, 0], steps = [1, 1, 2, 3]} : tensor<[2, 6, 5, 4], f32>
          %3 = cuvil.conv2d(%2, %1) {dilation = [1, 1], groups = 2, pads = [0, 0, 0, 0], stride = [1, 1]} : tensor<[2, 4, 5, 4], f32>
          cuvil.return(%3)
        }""", weights)
    x = np.random.default_rng(0).standard_normal((2, 6, 9, 10)).astype(np.float32)
    assert_close(run(module, [x]), run(parse_module(ir(STRIDED_1X1), weights), [x]))


def test_padded_or_wider_strided_convs_stay():
    for conv in ("{stride = [2, 2], pads = [1, 1, 1, 1], dilation = [1, 1], groups = 1} : tensor<[1, 4, 6, 6], f32>",
                 "{stride = [1, 1], pads = [0, 0, 0, 0], dilation = [1, 1], groups = 1} : tensor<[1, 4, 9, 10], f32>"):
        text = f"""
            func @main(%0: tensor<[1, 3, 9, 10], f32> "x") -> ("y") {{
              %1 = cuvil.constant() {{name = "w"}} : tensor<[4, 3, 1, 1], f32>
              %2 = cuvil.conv2d(%0, %1) {conv}
              cuvil.return(%2)
            }}"""
        module = apply(Canonicalize(), text, {"w": np.ones((4, 3, 1, 1), np.float32)})
        assert [op.name for op in module.main.body.ops] == ["cuvil.constant", "cuvil.conv2d", "cuvil.return"]
