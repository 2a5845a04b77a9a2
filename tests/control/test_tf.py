"""tf.cond and tf.while_loop through Cuvil: the TensorFlow frontend lowers If/While
nodes (their branches, condition and body are FunctionDefs) to cuvil.if / cuvil.while.
Each model runs through the IR interpreter and `cuvil.compile` against TensorFlow on
inputs that take both branches and many trip counts, and one is built with `cuvil build`
into executables for the host, aarch64 (qemu) and wasm32 (Node).

Tolerances: the models are float32 chains of a few small matmuls and tanh; after up to
~20 loop trips Cuvil and TensorFlow (oneDNN) differ by summation order only, well
inside ATOL + RTOL * |tf| below. Trip counts and branch counts are integers and
compared exactly (the inputs keep the loop conditions far from their thresholds)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import cuvil  # noqa: E402
import cuvil.ir as cir  # noqa: E402
from cuvil.errors import UnsupportedOpError  # noqa: E402
from cuvil.frontends.tf import capture_tf  # noqa: E402
from tests.targets.helpers import ALL, ROOT, build_project, run  # noqa: E402

ATOL, RTOL = 1e-5, 1e-5


# -- models ---------------------------------------------------------------------------------
class Gate(keras.Model):
    """Keras: a Dense + ReLU when the input's sum is positive, else another Dense, a shift
    and a tanh (tf.cond), then a Dense head."""

    def __init__(self):
        super().__init__()
        self.a = keras.layers.Dense(8, activation="relu")
        self.b = keras.layers.Dense(8)
        self.head = keras.layers.Dense(4)
        for layer in (self.a, self.b, self.head):
            layer.build((None, 8))  # weights exist before the branches are traced

    def call(self, x):
        h = tf.cond(tf.reduce_sum(x) > 0, lambda: self.a(x), lambda: tf.tanh(self.b(x) - 1.0))
        return self.head(h)


def halving():
    """y <- y W (W a contraction) or y * -0.5, chosen by a tf.cond on the sign of sum(y)
    in the loop body, until max|y| <= 1: the trip count depends on the data. Returns the
    number of trips, how many took the first branch, and y."""
    rng = np.random.default_rng(0)
    w = tf.Variable((np.eye(8) * 0.6 + rng.standard_normal((8, 8)) * 0.02).astype(np.float32), name="w")

    def body(i, taken, y):
        taken, y = tf.cond(tf.reduce_sum(y) > 0, lambda: (taken + 1, y @ w), lambda: (taken, y * -0.5))
        return i + 1, taken, y

    @tf.function(autograph=False)
    def f(x):
        return tf.while_loop(lambda i, taken, y: tf.reduce_max(tf.abs(y)) > 1.0, body,
                             (tf.constant(0), tf.constant(0), x))
    f.w = w  # keep the variable alive with the function
    return f


def halving_inputs():
    """Inputs from no trip at all to ~20, both signs of the sum."""
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((2, 8)).astype(np.float32) * s for s in (0.1, 3.0, 10.0, 100.0, 1e4)]
    return xs + [np.abs(xs[3]), -np.abs(xs[2]), -np.abs(xs[4])]


def limited():
    """A loop whose limit is an input (maximum_iterations=n) and which also stops when
    y has grown past 50."""
    rng = np.random.default_rng(2)
    w = tf.Variable((rng.standard_normal((6, 6)) * 0.3).astype(np.float32))
    b = tf.Variable((rng.standard_normal(6) * 0.1).astype(np.float32))

    @tf.function(autograph=False)
    def f(n, y):
        return tf.while_loop(lambda i, y: tf.reduce_max(tf.abs(y)) < 50.0,
                             lambda i, y: (i + 1, y * 1.5 + tf.tanh(y @ w + b)),
                             (tf.constant(0), y), maximum_iterations=n)
    f.vars = (w, b)
    return f


# -- helpers --------------------------------------------------------------------------------
def _tf_outputs(model, inputs):
    out = model(inputs[0], training=False) if isinstance(model, keras.Model) else model(*inputs)
    out = out if isinstance(out, (list, tuple)) else [out]
    return [np.asarray(t) for t in out]


def _close(got, want, what):
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, got.dtype, want.shape, want.dtype)
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL, err_msg=what)


def _capture(model, example):
    """The module and the compiled model; the module's text form round-trips."""
    module = capture_tf(model, example)
    text = cir.print_module(module)
    assert cir.print_module(cir.parse_module(text, module.weights())) == text
    return module, cuvil.compile(model, example)


def check_many(module, compiled, model, cases):
    """Every case through TensorFlow, the interpreter and the native code; TF's outputs."""
    wants = []
    for inputs in cases:
        want = _tf_outputs(model, inputs)
        native = compiled(*inputs)
        native = [native] if isinstance(native, np.ndarray) else list(native)
        for how, got in (("interpreter", cir.run(module, list(inputs))), ("native", native)):
            assert len(got) == len(want)
            for k, (g, w) in enumerate(zip(got, want)):
                _close(g, w, f"{how} output {k}")
        wants.append(want)
    return wants


def _region_ops(fn):
    return [op.name for op in fn.body.ops if op.regions]


# -- tests ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gate():
    keras.utils.set_random_seed(0)
    model = Gate()
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    return model, *_capture(model, [x])


def test_keras_cond_takes_both_branches(gate):
    model, module, compiled = gate
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((3, 8)).astype(np.float32) for _ in range(4)]
    xs += [np.abs(xs[0]), -np.abs(xs[1])]
    assert {bool(x.sum() > 0) for x in xs} == {True, False}
    check_many(module, compiled, model, [(x,) for x in xs])
    assert _region_ops(module.main) == ["cuvil.if"]
    op = next(op for op in module.main.body.ops if op.regions)
    # the Dense kernels are constants inside the branches, not operands of the if
    assert len(op.operands) == 2
    for region in op.regions:
        assert [c.value.shape for c in region.body.ops if c.name == "cuvil.constant" and c.value.ndim == 2] == [(8, 8)]


@pytest.fixture(scope="module")
def halving_model():
    model = halving()
    return model, *_capture(model, [halving_inputs()[2]])


def test_while_with_a_data_dependent_trip_count_and_a_nested_cond(halving_model):
    model, module, compiled = halving_model
    cases = [(x,) for x in halving_inputs()]
    wants = check_many(module, compiled, model, cases)
    trips = [int(w[0]) for w in wants]
    taken = [int(w[1]) for w in wants]
    assert trips[0] == 0 and len(set(trips)) >= 4 and max(trips) >= 10, trips
    assert any(0 < t < n for t, n in zip(taken, trips)), (taken, trips)  # both branches inside one run
    assert _region_ops(module.main) == ["cuvil.while"]
    loop = next(op for op in module.main.body.ops if op.regions)
    assert [_region_ops(r) for r in loop.regions] == [[], ["cuvil.if"]]


def test_while_limit_is_an_input():
    model = limited()
    y = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    module, compiled = _capture(model, [np.int32(3), y])
    cases = [(np.int32(n), y) for n in (0, 1, 3, 5, 100, -1)]
    wants = check_many(module, compiled, model, cases)
    trips = [int(w[0]) for w in wants]
    # stopped by the limit, then by the growth of y; a negative limit means no trip in TF
    assert trips[:4] == [0, 1, 3, 5] and 5 < trips[4] < 100 and trips[5] == 0, trips


def test_constant_predicate_inlines_the_taken_branch():
    flag = tf.Variable(False)

    @tf.function(autograph=False)
    def f(x):
        return tf.cond(flag, lambda: x * 2.0, lambda: tf.tanh(x) - 1.0)
    x = np.random.default_rng(6).standard_normal((2, 3)).astype(np.float32)
    module = capture_tf(f, [x])
    assert _region_ops(module.main) == []
    _close(cir.run(module, [x])[0], f(x).numpy(), "inlined else branch")


def test_loop_variable_that_changes_shape_is_refused():
    @tf.function(autograph=False)
    def f(x):
        return tf.while_loop(lambda y: tf.reduce_sum(y) < 100.0, lambda y: tf.concat([y, y[:1] + 1.0], 0), (x,),
                             shape_invariants=(tf.TensorShape([None, 3]),))
    with pytest.raises(UnsupportedOpError, match=r"loop variable '\w+' \(input \d of the loop, initially x:0\) "
                                                 r"is tensor<\[2, 3\], f32> on entry and tensor<\[3, 3\], f32> "
                                                 r"after the body"):
        capture_tf(f, [np.ones((2, 3), np.float32)])


# -- an executable ---------------------------------------------------------------------------
HALVING_PY = '''\
from tests.control.test_tf import halving, halving_inputs


def cuvil_entry():
    return halving(), [halving_inputs()[2]]
'''
HALVING_YAML = '''\
model:
  framework: tensorflow
  name: halving
  source: model.py
  entry: cuvil_entry
inputs:
  - {name: x, shape: [2, 8], dtype: f32}
outputs:
  - name: trips
  - name: taken
  - name: y
'''


@pytest.mark.parametrize("target", ALL)
def test_halving_executable(target, halving_model, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    exe = build_project(tmp_path, HALVING_PY, HALVING_YAML, target, "halving")
    model = halving_model[0]
    for k, x in enumerate(halving_inputs()[:5]):
        np.save(tmp_path / f"x{k}.npy", x)
        run(exe, "--input", f"x={tmp_path / f'x{k}.npy'}", "--output", tmp_path / f"out{k}.json")
        outs = {o["name"]: o["data"] for o in json.loads((tmp_path / f"out{k}.json").read_text())["outputs"]}
        want = _tf_outputs(model, [x])
        for name, w in zip(("trips", "taken", "y"), want):
            _close(np.asarray(outs[name], dtype=w.dtype).reshape(w.shape), w, f"{target} {name} case {k}")
