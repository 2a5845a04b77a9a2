"""Symbolic dims in the IR: the polynomial algebra, types, shape rules and the interpreter."""
from __future__ import annotations

import numpy as np
import pytest

from cuvil.errors import CuvilError, ParseError, VerifyError
from cuvil.ir import TensorType, run, symdim, verify
from cuvil.ir.parser import parse_module


def test_canonical_text_makes_equal_dims_equal():
    assert symdim.canonical("seq*12*batch") == symdim.canonical("12 * batch*seq") == "12*batch*seq"
    assert symdim.mul("batch", "seq") == symdim.mul("seq", "batch") == "batch*seq"
    assert symdim.add("seq", 1) == "seq+1"
    assert symdim.sub(symdim.add("seq", 1), 1) == "seq"
    assert symdim.sub("seq", "seq") == 0
    assert symdim.product(["batch", 4, "seq", 2]) == "8*batch*seq"
    assert symdim.canonical("4") == 4


def test_exact_division_and_evaluation():
    assert symdim.exact_div("12*batch*seq", "batch") == "12*seq"
    assert symdim.exact_div("12*batch*seq", 4) == "3*batch*seq"
    assert symdim.exact_div("12*batch*seq", 5) is None
    assert symdim.exact_div("batch", "seq") is None
    assert symdim.evaluate("12*batch*seq+3", {"batch": 2, "seq": 5}) == 123
    bounds = {"batch": (1, 8), "seq": (4, 512)}
    assert symdim.upper_bound("batch*seq+1", bounds) == 8 * 512 + 1
    assert symdim.lower_bound("batch*seq-2", bounds) == 2
    with pytest.raises(KeyError, match="seq"):
        symdim.evaluate("seq", {})


@pytest.mark.parametrize("text", ["", "2x", "batch/2", "a**2", "(a)", "a+", "*a"])
def test_bad_dim_text_is_a_parse_error(text):
    with pytest.raises(ParseError):
        symdim.parse(text)


def test_types_carry_expressions_and_round_trip():
    t = TensorType(("batch", "seq * 12", 64), "f32")
    assert t.shape == ("batch", "12*seq", 64)
    assert TensorType.parse(str(t)) == t
    assert t.numel_dim == "768*batch*seq"
    assert t.symbols == {"batch", "seq"}
    assert t.bound({"batch": (1, 2), "seq": (1, 10)}).shape == (2, 120, 64)
    assert t.at({"batch": 3, "seq": 5}).nbytes == 3 * 60 * 64 * 4
    with pytest.raises(ValueError, match="symbolic dim"):
        TensorType(("batch/2",))


PROGRAM = """
func @main(%0: tensor<[b, s, 4], f32> "x", %1: tensor<[b, s], i64> "m") -> ("y", "z") attributes {dim_bounds = {b = [1, 4], s = [1, 9]}} {
  %2 = cuvil.reshape(%0) {shape = ["b*s", 4]} : tensor<[b*s, 4], f32>
  %3 = cuvil.concat(%2, %2) {axis = 0} : tensor<[2*b*s, 4], f32>
  %4 = cuvil.slice(%0) {ends = ["b", 1, 4], starts = [0, 0, 0], steps = [1, 1, 1]} : tensor<[b, 1, 4], f32>
  %5 = cuvil.pad(%0) {pads = [[0, 0], [1, 2], [0, 0]], value = 0.0} : tensor<[b, s+3, 4], f32>
  %6 = cuvil.dim() {dims = ["b*s"]} : tensor<[], i64>
  %7 = cuvil.mul(%1, %6) {} : tensor<[b, s], i64>
  cuvil.return(%5, %7)
}
"""


def test_shape_rules_and_interpreter_with_symbols():
    m = parse_module(PROGRAM)
    verify(m)
    ops = {op.name: op for op in m.main.body.ops}
    assert ops["cuvil.concat"].result.type.shape == ("2*b*s", 4)
    assert ops["cuvil.pad"].result.type.shape == ("b", "s+3", 4)
    rng = np.random.default_rng(0)
    for b, s in [(1, 1), (2, 5), (4, 9)]:
        x = rng.standard_normal((b, s, 4)).astype(np.float32)
        mask = rng.integers(0, 3, (b, s))
        y, z = run(m, [x, mask])
        np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (1, 2), (0, 0)]))
        np.testing.assert_array_equal(z, mask * b * s)


def test_interpreter_checks_shapes_against_symbols_and_bounds():
    m = parse_module(PROGRAM)
    x, mask = np.zeros((2, 5, 4), np.float32), np.zeros((2, 5), np.int64)
    with pytest.raises(CuvilError, match=r"'m': dim 1 \(s\) is 4, but another input gives s = 5"):
        run(m, [x, mask[:, :4]])
    with pytest.raises(CuvilError, match=r"dim 0 \(b\) = 5 is outside its bounds \[1, 4\]"):
        run(m, [np.zeros((5, 5, 4), np.float32), np.zeros((5, 5), np.int64)])
    with pytest.raises(CuvilError, match=r"'x': expected shape \['b', 's', 4\], got \[2, 5, 3\]"):
        run(m, [np.zeros((2, 5, 3), np.float32), mask])


def test_reshape_with_a_wrong_symbolic_count_is_refused():
    with pytest.raises(VerifyError, match="has 4\\*b\\*s elements, shape \\['b', 4\\] has 4\\*b"):
        verify(parse_module("""
            func @main(%0: tensor<[b, s, 4], f32> "x") -> ("y") {
              %1 = cuvil.reshape(%0) {shape = ["b", 4]} : tensor<[b, 4], f32>
              cuvil.return(%1)
            }"""))
