"""ONNX If, Loop and Scan through `cuvil.compile` against ONNX Runtime: branches read
tensors of the enclosing graph (inputs, initializers, computed values), loops with a
run-time trip count and a data-dependent condition, scan outputs, Scan in both
directions and along other axes, and nested control flow. Float32 chains of a few ops:
ATOL 1e-5 (summation order over up to 20 trips); integers and counts exactly."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import cuvil  # noqa: E402
import cuvil.ir as cir  # noqa: E402
from cuvil.errors import UnsupportedOpError  # noqa: E402
from cuvil.frontends.onnx import capture_onnx  # noqa: E402

ATOL = 1e-5
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def check(m, cases, atol=ATOL):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    module = capture_onnx(m, cases[0])
    text = cir.print_module(module)
    assert cir.print_module(cir.parse_module(text, module.weights())) == text
    compiled = cuvil.compile(m, cases[0])
    for inputs in cases:
        want = sess.run(None, dict(zip(names, inputs)))
        got = compiled(*inputs)
        got = [got] if isinstance(got, np.ndarray) else list(got)
        interp = cir.run(module, inputs)
        for have in (got, interp):
            assert len(have) == len(want)
            for g, w in zip(have, want):
                g = np.asarray(g)
                assert g.shape == w.shape and g.dtype == w.dtype
                np.testing.assert_allclose(g, w, atol=atol, rtol=0)
    return module


def control_ops(module):
    return [op.name for fn in module.all_functions() for op in fn.body.ops if op.regions]


def test_if_reads_outer_tensors_and_takes_both_branches():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t0"]),
                                helper.make_node("Relu", ["t0"], ["t1"])], "then", [], [vi("t1", F, [2, 4])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "h"], ["e0"])], "else", [], [vi("e0", F, [2, 4])])
    nodes = [helper.make_node("Tanh", ["x"], ["h"]),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.float32(0), "z")),
             helper.make_node("Greater", ["s", "zero"], ["p"]),
             helper.make_node("If", ["p"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = model(nodes, [vi("x", F, [2, 4])], [vi("y", F, [2, 4])], [w])
    xs = [rng.standard_normal((2, 4)).astype(np.float32) for _ in range(4)]
    xs += [np.abs(xs[0]), -np.abs(xs[0])]
    module = check(m, [[x] for x in xs])
    assert control_ops(module) == ["cuvil.if"]


def test_if_with_a_constant_condition_is_inlined():
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["a"])], "then", [], [vi("a", F, [3])])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["b"])], "else", [], [vi("b", F, [3, 1])])
    nodes = [helper.make_node("Constant", [], ["p"], value=numpy_helper.from_array(np.array(True), "p")),
             helper.make_node("If", ["p"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = model(nodes, [vi("x", F, [3])], [vi("y", F, [3])])
    module = check(m, [[np.array([1.0, -2.0, 3.0], np.float32)]])
    assert control_ops(module) == []  # the else branch (another shape) never mattered


def test_if_branches_of_different_shapes_are_refused():
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["a"])], "then", [], [vi("a", F, [3])])
    else_g = helper.make_graph([helper.make_node("Unsqueeze", ["x", "ax"], ["b"])], "else", [], [vi("b", F, [1, 3])])
    ax = numpy_helper.from_array(np.array([0], np.int64), "ax")
    m = model([helper.make_node("If", ["p"], ["y"], then_branch=then_g, else_branch=else_g)],
              [vi("p", B, []), vi("x", F, [3])], [vi("y", F, [3])], [ax])
    with pytest.raises(UnsupportedOpError, match="both branches must give the same shapes"):
        cuvil.compile(m, [np.array(True), np.zeros(3, np.float32)])


def _loop_model(with_limit: bool):
    """y <- y * w + b while sum(y) < 100 (and, with a limit, at most M times); also
    counts the trips in a second loop-carried value."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["y_in", "w"], ["m"]),
         helper.make_node("Add", ["m", "b"], ["y_out"]),
         helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "cap"], ["c_out"]),
         helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.int64(1), "one")),
         helper.make_node("Add", ["n_in", "one"], ["n_out"])],
        "body", [vi("i", I64, []), vi("c_in", B, []), vi("y_in", F, [1, 3]), vi("n_in", I64, [])],
        [vi("c_out", B, []), vi("y_out", F, [1, 3]), vi("n_out", I64, [])])
    w = numpy_helper.from_array(np.array([[1.1, 0.1, 0], [0, 1.2, 0.1], [0.1, 0, 1.05]], np.float32), "w")
    b = numpy_helper.from_array(np.array([[0.5, 0.25, 0.0]], np.float32), "b")
    cap = numpy_helper.from_array(np.float32(100.0), "cap")
    zero = numpy_helper.from_array(np.int64(0), "zero")
    nodes = [helper.make_node("Constant", [], ["go"], value=numpy_helper.from_array(np.array(True), "go")),
             helper.make_node("Loop", ["M" if with_limit else "", "go", "y0", "zero"], ["y", "n"], body=body)]
    inputs = ([vi("M", I64, [])] if with_limit else []) + [vi("y0", F, [1, 3])]
    return model(nodes, inputs, [vi("y", F, [1, 3]), vi("n", I64, [])], [w, b, cap, zero])


def test_loop_with_a_data_dependent_condition():
    cases = [[np.array([[s, s, s]], np.float32)] for s in (0.0, 1.0, 5.0, 40.0, 200.0)]
    module = check(_loop_model(False), cases)
    assert control_ops(module) == ["cuvil.while"]


def test_loop_trip_count_is_a_run_time_input():
    y0 = np.array([[1.0, 2.0, 3.0]], np.float32)
    check(_loop_model(True), [[np.array(m, np.int64), y0] for m in (3, 0, 1, 7, 100, -2)])


def test_loop_scan_outputs_with_a_constant_trip_count():
    body = helper.make_graph(
        [helper.make_node("Mul", ["y_in", "k"], ["y_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Add", ["y_out", "fi"], ["row"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [vi("i", I64, []), vi("c_in", B, []), vi("y_in", F, [2])],
        [vi("c_out", B, []), vi("y_out", F, [2]), vi("row", F, [2])])
    nodes = [helper.make_node("Constant", [], ["M"], value=numpy_helper.from_array(np.int64(6), "M")),
             helper.make_node("Constant", [], ["go"], value=numpy_helper.from_array(np.array(True), "go")),
             helper.make_node("Neg", ["x"], ["k"]),
             helper.make_node("Loop", ["M", "go", "x"], ["y", "rows"], body=body)]
    m = model(nodes, [vi("x", F, [2])], [vi("y", F, [2]), vi("rows", F, [6, 2])])
    check(m, [[np.array([0.5, -1.5], np.float32)], [np.array([2.0, 0.0], np.float32)]])


def test_loop_scan_outputs_need_a_constant_trip_count():
    body = helper.make_graph([helper.make_node("Identity", ["c_in"], ["c_out"]),
                              helper.make_node("Identity", ["y_in"], ["y_out"]),
                              helper.make_node("Identity", ["y_in"], ["row"])],
                             "body", [vi("i", I64, []), vi("c_in", B, []), vi("y_in", F, [2])],
                             [vi("c_out", B, []), vi("y_out", F, [2]), vi("row", F, [2])])
    m = model([helper.make_node("Loop", ["M", "", "x"], ["y", "rows"], body=body)],
              [vi("M", I64, []), vi("x", F, [2])], [vi("y", F, [2]), vi("rows", F, [3, 2])])
    with pytest.raises(UnsupportedOpError, match="constant trip count"):
        cuvil.compile(m, [np.array(3, np.int64), np.zeros(2, np.float32)])


@pytest.mark.parametrize("directions, axes", [((0, 0), (0, 0)), ((1, 0), (0, 1)), ((0, 1), (1, 0))])
def test_scan_directions_and_axes(directions, axes):
    """A running sum over x's rows (input direction d_in) and the running product of
    exp(-|x|), the sums written along output axis 0 or 1 (direction d_out)."""
    d_in, d_out = directions
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Abs", ["x_t"], ["a"]), helper.make_node("Neg", ["a"], ["na"]),
         helper.make_node("Exp", ["na"], ["e"]), helper.make_node("Mul", ["p_in", "e"], ["p_out"]),
         helper.make_node("Identity", ["s_out"], ["row"])],
        "body", [vi("s_in", F, [3]), vi("p_in", F, [3]), vi("x_t", F, [3])],
        [vi("s_out", F, [3]), vi("p_out", F, [3]), vi("row", F, [3])])
    out_shape = [5, 3] if axes[1] == 0 else [3, 5]
    nodes = [helper.make_node("Scan", ["s0", "p0", "x"], ["s", "p", "rows"], body=body, num_scan_inputs=1,
                              scan_input_directions=[d_in], scan_output_directions=[d_out],
                              scan_output_axes=[axes[1]], scan_input_axes=[axes[0]])]
    x_shape = [5, 3] if axes[0] == 0 else [3, 5]
    m = model(nodes, [vi("s0", F, [3]), vi("p0", F, [3]), vi("x", F, x_shape)],
              [vi("s", F, [3]), vi("p", F, [3]), vi("rows", F, out_shape)])
    rng = np.random.default_rng(1)
    check(m, [[rng.standard_normal(3).astype(np.float32), np.ones(3, np.float32),
               rng.standard_normal(x_shape).astype(np.float32)] for _ in range(2)])


def test_if_nested_in_a_loop_body():
    then_g = helper.make_graph([helper.make_node("Mul", ["y_in", "half"], ["t"])], "then", [], [vi("t", F, [4])])
    else_g = helper.make_graph([helper.make_node("Sub", ["y_in", "x"], ["e"])], "else", [], [vi("e", F, [4])])
    body = helper.make_graph(
        [helper.make_node("ReduceSum", ["y_in"], ["s"], keepdims=0),
         helper.make_node("Greater", ["s", "zero"], ["p"]),
         helper.make_node("If", ["p"], ["y_out"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [vi("i", I64, []), vi("c_in", B, []), vi("y_in", F, [4])], [vi("c_out", B, []), vi("y_out", F, [4])])
    inits = [numpy_helper.from_array(np.float32(0.5), "half"), numpy_helper.from_array(np.float32(0), "zero")]
    m = model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)],
              [vi("M", I64, []), vi("x", F, [4])], [vi("y", F, [4])], inits)
    x = np.array([1.0, -3.0, 2.5, 0.25], np.float32)
    module = check(m, [[np.array(n, np.int64), x] for n in (0, 1, 4, 9)])
    assert control_ops(module) == ["cuvil.if", "cuvil.while"]


# -- data-dependent sizes ------------------------------------------------------------------------
def test_nonzero_and_a_gather_after_it():
    nodes = [helper.make_node("Greater", ["x", "t"], ["m"]), helper.make_node("NonZero", ["m"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["rows"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "rows"], ["picked"])]
    t = numpy_helper.from_array(np.float32(0.3), "t")
    m = model(nodes, [vi("x", F, [3, 5])], [vi("nz", I64, [2, 15]), vi("picked", F, [15])], [t])
    rng = np.random.default_rng(3)
    cases = [[(rng.standard_normal((3, 5)) + s).astype(np.float32)] for s in (0.0, -9.0, 9.0, 0.5)]
    try:
        check(m, cases)
    except UnsupportedOpError as e:  # GatherND is not in the frontend: NonZero alone then
        assert "GatherND" in str(e)
        m = model(nodes[:2], [vi("x", F, [3, 5])], [vi("nz", I64, [2, 15])], [t])
        check(m, cases)


@pytest.mark.parametrize("is_sorted", [1, 0])
def test_unique_sorted_and_in_order_of_first_occurrence(is_sorted):
    node = helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], sorted=is_sorted)
    m = model([node], [vi("x", F, [12])], [vi("y", F, [12]), vi("first", I64, [12]), vi("inverse", I64, [12]),
                                           vi("counts", I64, [12])])
    rng = np.random.default_rng(4)
    cases = [[rng.integers(-3, 4, 12).astype(np.float32)] for _ in range(3)]
    cases += [[np.full(12, 2.5, np.float32)], [np.arange(12, dtype=np.float32)[::-1].copy()]]
    check(m, cases)
