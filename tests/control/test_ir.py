"""Ops with regions in the IR: cuvil.if and cuvil.while in their text form (golden
texts that must print back byte for byte), the verifier's checks, the passes inside
regions, and the NumPy interpreter against native code against a plain NumPy loop.
Values here are exact (small integers and float32 products of them), so every
comparison is exact."""
from __future__ import annotations

import numpy as np
import pytest

import cuvil
import cuvil.ir as cir
from cuvil.errors import ParseError, VerifyError
from cuvil.passes import run_pipeline

WHILE = '''\
func @main(%0: tensor<[], i64> "n", %1: tensor<[3], f32> "x") -> ("y") {
  %2 = cuvil.constant() {name = "w"} : tensor<[3], f32>
  %3 = cuvil.constant() {name = "zero"} : tensor<[], i64>
  %4, %5 = cuvil.while(%3, %1, %0, %2) {carried = 2} : tensor<[], i64>, tensor<[3], f32> regions {
    func @cond(%0: tensor<[], i64> "i", %1: tensor<[3], f32> "acc", %2: tensor<[], i64> "n", %3: tensor<[3], f32> "w") -> ("go") {
      %4 = cuvil.lt(%0, %2) {} : tensor<[], bool>
      cuvil.return(%4)
    }
    func @body(%0: tensor<[], i64> "i", %1: tensor<[3], f32> "acc", %2: tensor<[], i64> "n", %3: tensor<[3], f32> "w") -> ("i1", "acc1") {
      %4 = cuvil.constant() {name = "one"} : tensor<[], i64>
      %5 = cuvil.add(%0, %4) {} : tensor<[], i64>
      %6 = cuvil.mul(%1, %3) {} : tensor<[3], f32>
      %7 = cuvil.constant() {name = "half"} : tensor<[], f32>
      %8 = cuvil.add(%6, %7) {} : tensor<[3], f32>
      %9 = cuvil.neg(%8) {} : tensor<[3], f32>
      cuvil.return(%5, %8)
    }
  }
  %6 = cuvil.constant() {name = "two"} : tensor<[], f32>
  %7 = cuvil.mul(%5, %6) {} : tensor<[3], f32>
  cuvil.return(%7)
}
'''

IF = '''\
func @main(%0: tensor<[], bool> "p", %1: tensor<[2, 3], f32> "x") -> ("y", "z") {
  %2 = cuvil.constant() {name = "w"} : tensor<[3], f32>
  %3, %4 = cuvil.if(%0, %1, %2) {} : tensor<[2, 3], f32>, tensor<[2, 3], f32> regions {
    func @then(%0: tensor<[2, 3], f32> "x", %1: tensor<[3], f32> "w") -> ("a", "b") {
      %2 = cuvil.mul(%0, %1) {} : tensor<[2, 3], f32>
      %3 = cuvil.relu(%0) {} : tensor<[2, 3], f32>
      cuvil.return(%2, %3)
    }
    func @else(%0: tensor<[2, 3], f32> "x", %1: tensor<[3], f32> "w") -> ("a", "b") {
      %2 = cuvil.constant() {name = "three"} : tensor<[], f32>
      %3 = cuvil.sub(%0, %2) {} : tensor<[2, 3], f32>
      cuvil.return(%3, %0)
    }
  }
  %5 = cuvil.add(%3, %4) {} : tensor<[2, 3], f32>
  cuvil.return(%5, %3)
}
'''

WEIGHTS = {"w": np.array([0.5, -1.0, 2.0], np.float32), "zero": np.array(0, np.int64),
           "one": np.array(1, np.int64), "half": np.array(0.5, np.float32), "two": np.array(2.0, np.float32),
           "three": np.array(3.0, np.float32)}
X3 = np.array([1.0, 2.0, 3.0], np.float32)
X23 = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], np.float32)


def parsed(text: str) -> cir.Module:
    return cir.parse_module(text, {k: v.copy() for k, v in WEIGHTS.items()})


def while_reference(n: int, x: np.ndarray) -> np.ndarray:
    acc = x.copy()
    for _ in range(n):
        acc = acc * WEIGHTS["w"] + np.float32(0.5)
    return acc * np.float32(2)


def if_reference(p: bool, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = (x * WEIGHTS["w"], np.maximum(x, 0)) if p else (x - np.float32(3), x)
    return a + b, a


@pytest.mark.parametrize("text", [WHILE, IF], ids=["while", "if"])
def test_golden_text_round_trips(text):
    module = parsed(text)
    cir.verify(module)
    assert cir.print_module(module) == text
    names = [fn.name for fn in module.all_functions()]
    assert names[-1] == "main" and set(names[:-1]) in ({"cond", "body"}, {"then", "else"})


def test_planned_text_round_trips():
    """After the pipeline (fused ops, plan attributes on the op and on the regions)."""
    module = parsed(WHILE)
    run_pipeline(module)
    text = cir.print_module(module)
    assert "loop_offsets" in text and "arena_offsets" in text
    assert cir.print_module(cir.parse_module(text, module.weights())) == text


@pytest.mark.parametrize("n", [0, 1, 2, 5, 17])
def test_while_interpreter_native_numpy_agree(n):
    want = while_reference(n, X3)
    module = parsed(WHILE)
    np.testing.assert_array_equal(cir.run(module, [np.array(n), X3])[0], want)
    compiled = cuvil.compile(parsed(WHILE))
    np.testing.assert_array_equal(np.asarray(compiled(np.array(n), X3)[0]), want)


def test_while_negative_limit_runs_no_iteration():
    compiled = cuvil.compile(parsed(WHILE))
    np.testing.assert_array_equal(np.asarray(compiled(np.array(-3), X3)[0]), X3 * 2)


@pytest.mark.parametrize("p", [True, False])
def test_if_interpreter_native_numpy_agree(p):
    want = if_reference(p, X23)
    got_interp = cir.run(parsed(IF), [np.array(p), X23])
    got_native = cuvil.compile(parsed(IF))(np.array(p), X23)
    for got in (got_interp, got_native):
        assert len(got) == 2
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w)


def test_one_compiled_if_takes_both_branches_in_turn():
    compiled = cuvil.compile(parsed(IF))
    for p in (True, False, False, True):
        for g, w in zip(compiled(np.array(p), X23), if_reference(p, X23)):
            np.testing.assert_array_equal(np.asarray(g), w)


def test_passes_work_inside_regions():
    module = parsed(WHILE)
    run_pipeline(module)
    loop = next(op for op in module.main.body.ops if op.name == "cuvil.while")
    cond, body = loop.regions
    body_ops = [op.name for op in body.body.ops]
    assert "cuvil.neg" not in body_ops, "dead code inside the body survived"
    assert body_ops.count("cuvil.fused") == 2, body_ops  # mul + add fused inside the region
    assert {"arena_size", "intermediate_bytes"} <= set(body.attrs) and "arena_size" in cond.attrs
    # each result has its own buffer, and the loop's scratch holds the predicate and the
    # next values (one slot per carried value) inside main's arena
    assert len(loop.attrs["arena_offsets"]) == 2 and len(loop.attrs["loop_offsets"]) == 3
    slots = sorted(loop.attrs["arena_offsets"] + loop.attrs["loop_offsets"])
    assert len(set(slots)) == len(slots)
    assert max(slots) < module.main.attrs["arena_size"]


# -- the verifier and the parser refuse malformed ops ---------------------------------------
@pytest.mark.parametrize("edit, message", [
    (("{carried = 2}", "{carried = 3}"), "results must have the carried values. types"),
    (('-> ("go") {\n      %4 = cuvil.lt(%0, %2) {} : tensor<[], bool>\n      cuvil.return(%4)',
      '-> ("go", "again") {\n      %4 = cuvil.lt(%0, %2) {} : tensor<[], bool>\n      cuvil.return(%4, %4)'),
     "cond region returns 2 values"),
    (("%4 = cuvil.lt(%0, %2) {} : tensor<[], bool>", "%4 = cuvil.lt(%1, %3) {} : tensor<[3], bool>"),
     "condition must have one element"),
    (("cuvil.return(%5, %8)", "cuvil.return(%8, %5)"), "body region returns"),
])
def test_verifier_names_what_is_wrong(edit, message):
    text = WHILE.replace(*edit)
    assert text != WHILE
    with pytest.raises((VerifyError, ParseError), match=message):
        cir.verify(parsed(text))


def test_if_branch_types_must_match():
    text = IF.replace("      cuvil.return(%3, %0)", "      cuvil.return(%3, %1)")
    with pytest.raises((VerifyError, ParseError), match="else region returns"):
        cir.verify(parsed(text))


@pytest.mark.parametrize("cut", ["    }\n  }\n", "regions {\n", "  }\n  %6"])
def test_truncated_regions_are_a_parse_error(cut):
    text = WHILE.replace(cut, "", 1)
    with pytest.raises(ParseError):
        parsed(text)


DYNAMIC = '''\
func @main(%0: tensor<[2, 3], f32> "x") -> ("idx", "picked", "values", "inverse", "counts") attributes {dim_bounds = {nonzero = [0, 6], unique = [0, 6]}} {
  %1 = cuvil.constant() {name = "zero"} : tensor<[], f32>
  %2 = cuvil.gt(%0, %1) {} : tensor<[2, 3], bool>
  %3 = cuvil.nonzero(%2) {size = "nonzero"} : tensor<[nonzero, 2], i64>
  %4 = cuvil.reshape(%0) {shape = [6]} : tensor<[6], f32>
  %5 = cuvil.unique(%4) {size = "unique"} : tensor<[unique], f32>
  %6 = cuvil.unique_inverse(%4, %5) {} : tensor<[6], i64>
  %7 = cuvil.unique_counts(%4, %5) {} : tensor<[unique], i64>
  %8 = cuvil.gather(%5, %6) {axis = 0} : tensor<[6], f32>
  cuvil.return(%3, %8, %5, %6, %7)
}
'''


def test_data_dependent_ops_golden_text_interpreter_and_native():
    module = cir.parse_module(DYNAMIC, {"zero": np.array(0.0, np.float32)})
    cir.verify(module)
    assert cir.print_module(module) == DYNAMIC
    x = np.array([[1.5, -2.0, 1.5], [0.0, 3.0, -2.0]], np.float32)
    values, inverse, counts = np.unique(x.reshape(-1), return_inverse=True, return_counts=True)
    want = [np.argwhere(x > 0), values[inverse], values, inverse.reshape(-1), counts]
    for got in (cir.run(module, [x]), cuvil.compile(cir.parse_module(DYNAMIC, {"zero": np.array(0.0, np.float32)}))(x)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert np.shape(g) == w.shape
            np.testing.assert_array_equal(g, w)


def test_a_produced_dim_needs_its_size_attribute():
    text = DYNAMIC.replace('cuvil.nonzero(%2) {size = "nonzero"}', "cuvil.nonzero(%2) {}")
    with pytest.raises((VerifyError, ParseError), match="size"):
        cir.verify(cir.parse_module(text, {"zero": np.array(0.0, np.float32)}))
