"""The TensorFlow / Keras frontend: Keras models and tf.functions through `cuvil.compile`
(native code) against TensorFlow's own outputs.

Tolerance (the core bar): max |cuvil - tf| <= 1e-4 * max |tf|, fp32.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import cuvil  # noqa: E402
from cuvil.errors import UnsupportedOpError  # noqa: E402
from cuvil.frontends.tf import capture_tf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
REL_TOL = 1e-4


def _inputs(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _check(model, inputs, rel_tol=REL_TOL):
    """Compile with Cuvil, compare every output with TensorFlow's; returns the compiled model."""
    compiled = cuvil.compile(model, inputs)
    if isinstance(model, keras.Model):
        ref = model(inputs[0] if len(inputs) == 1 else list(inputs), training=False)
    else:
        ref = model(*inputs)
    refs = [np.asarray(r) for r in (ref if isinstance(ref, (list, tuple)) else [ref])]
    got = compiled(*inputs)
    assert len(got) == len(refs)
    for g, r in zip(got, refs):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, g.dtype, r.shape, r.dtype)
        scale = float(np.abs(r).max())
        assert scale > 0, "reference output is all zeros: the test would prove nothing"
        err = float(np.abs(g.astype(np.float64) - r).max())
        assert err <= rel_tol * scale, f"max abs error {err:.3g} > {rel_tol:g} * {scale:.3g}"
    return compiled


def _randomize_batch_norm(model, seed=1):
    """Non-trivial moving statistics, so that folding batch norm is exercised."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            g, b, m, v = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, g.shape), rng.normal(size=b.shape),
                               rng.normal(size=m.shape), rng.uniform(0.5, 2.0, v.shape)])
    return model


def keras_cnn(batch=2):
    """Conv (strides, SAME/VALID, dilation), depthwise, batch norm, ReLU6/ELU, residual
    add, zero padding, max and average pooling, global pooling, dense + softmax."""
    keras.utils.set_random_seed(0)
    L = keras.layers
    inp = keras.Input((32, 32, 3), batch_size=batch)
    x = L.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(inp)
    x = L.BatchNormalization()(x)
    x = L.ReLU(6.0)(x)
    x = L.DepthwiseConv2D(3, padding="same")(x)
    x = L.BatchNormalization()(x)
    x = L.Activation("relu")(x)
    y = L.Conv2D(16, 1, padding="valid")(x)
    x = L.Add()([x, y])
    x = L.ZeroPadding2D(((1, 0), (1, 0)))(x)
    x = L.DepthwiseConv2D(3, strides=2, padding="valid", depth_multiplier=2)(x)
    x = L.Conv2D(24, 3, dilation_rate=2, padding="same", activation="elu")(x)
    x = L.MaxPooling2D(2)(x)
    x = L.AveragePooling2D(3, strides=2, padding="same")(x)
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(10, activation="softmax")(x)
    return _randomize_batch_norm(keras.Model(inp, x))


def keras_encoder_block(batch=2, seq=16, dim=32, heads=4):
    """A transformer encoder block: multi-head self-attention, residuals, layer norm,
    a GELU feed-forward network."""
    keras.utils.set_random_seed(0)
    L = keras.layers
    inp = keras.Input((seq, dim), batch_size=batch)
    att = L.MultiHeadAttention(num_heads=heads, key_dim=dim // heads)(inp, inp)
    x = L.LayerNormalization(epsilon=1e-6)(inp + att)
    f = L.Dense(4 * dim, activation="gelu")(x)
    f = L.Dense(dim)(f)
    return keras.Model(inp, L.LayerNormalization(epsilon=1e-6)(x + f))


def test_keras_cnn_matches_tensorflow():
    model = keras_cnn()
    compiled = _check(model, _inputs(0, (2, 32, 32, 3)))
    ops = [op.name for op in compiled.ir.main.body.ops]
    # NHWC is converted once at the input: convolutions and pooling chain in NCHW.
    assert ops.count("cuvil.transpose") == 1, ops
    assert "cuvil.batch_norm" not in ops and ops.count("cuvil.conv2d") == 5


def test_keras_transformer_encoder_block_matches_tensorflow():
    _check(keras_encoder_block(), _inputs(0, (2, 16, 32)))


def test_keras_sequential_dense_with_batch_one():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((20,), batch_size=1), keras.layers.Dense(32, activation="tanh"),
                              keras.layers.Dense(8, activation="sigmoid")])
    _check(model, _inputs(1, (1, 20)))


def test_keras_embedding_and_multiple_inputs():
    keras.utils.set_random_seed(0)
    L = keras.layers
    ids = keras.Input((6,), batch_size=2, dtype="int32")
    feats = keras.Input((6, 8), batch_size=2)
    x = L.Embedding(50, 8)(ids)
    x = L.Concatenate()([x, feats])
    x = L.Conv1D(12, 3, padding="same", activation="relu")(x)
    x = L.GlobalMaxPooling1D()(x)
    model = keras.Model([ids, feats], L.Dense(4)(x))
    rng = np.random.default_rng(2)
    _check(model, [rng.integers(0, 50, (2, 6)).astype(np.int32), rng.standard_normal((2, 6, 8)).astype(np.float32)])


# tf.functions that exercise one group of GraphDef ops each.
def _fn_shapes(x):
    y = tf.reshape(x, [2, 3, 20])
    y = tf.transpose(y, [0, 2, 1])[:, 1:-1:2, ::1]
    y = tf.concat([y, tf.expand_dims(y[:, 0, :], 1)], axis=1)
    y = tf.pad(y, [[0, 0], [1, 1], [0, 1]], constant_values=0.5)
    y = tf.squeeze(tf.tile(y[:, :, :1], [1, 1, 3])[..., :1], axis=-1)
    s = tf.split(y, 2, axis=1)
    return tf.stack([s[0], s[1]], axis=0) * tf.cast(tf.shape(x)[1], tf.float32)


def _fn_math(x):
    a = tf.nn.relu6(x * 4.0) - tf.nn.elu(x) + tf.sigmoid(x) * tf.tanh(x)
    b = tf.math.rsqrt(tf.abs(x) + 1.0) + tf.sqrt(tf.square(x) + 0.1) - tf.math.erf(x) + tf.math.erfc(x)
    c = tf.math.squared_difference(a, b) / (tf.exp(-tf.abs(x)) + 1.0) + tf.maximum(a, 0.2) - tf.minimum(b, 1.0)
    d = tf.where(x > 0.1, tf.nn.leaky_relu(x, 0.1), tf.nn.softplus(x)) + tf.nn.gelu(x, approximate=True)
    return tf.reduce_mean(c, axis=1, keepdims=True) + tf.reduce_sum(d, axis=[0]) - tf.reduce_max(a, axis=-1, keepdims=True)


def _fn_matmul(x, y):
    q = tf.matmul(x, y, transpose_b=True)
    k = tf.einsum("bij,bkj->bik", x, y)
    v = tf.linalg.matmul(tf.nn.softmax(q, axis=-1), y)
    return q + k, tf.einsum("bik,bkj->bij", tf.nn.log_softmax(k), v)


def _fn_conv(x):
    w = tf.constant(np.random.default_rng(3).standard_normal((3, 3, 4, 6)).astype(np.float32) * 0.2)
    dw = tf.constant(np.random.default_rng(4).standard_normal((5, 5, 4, 1)).astype(np.float32) * 0.2)
    a = tf.nn.conv2d(x, w, strides=[1, 2, 1, 1], padding="SAME")
    b = tf.nn.conv2d(x, w, strides=1, padding="VALID", dilations=2)
    c = tf.nn.depthwise_conv2d(x, dw, strides=[1, 1, 1, 1], padding="SAME")
    c = tf.nn.max_pool2d(tf.nn.bias_add(c, tf.range(4, dtype=tf.float32)), 3, 2, "SAME")
    d = tf.nn.avg_pool2d(x, 2, 2, "VALID")
    return a, b, c + tf.reduce_mean(d, axis=[1, 2], keepdims=True), tf.nn.relu(a)[:, :, ::2, :]


def _fn_gather(x, idx):
    return tf.gather(x, idx, axis=1) + tf.gather(x, [2, 0], axis=1)[:, :1, None]


@pytest.mark.parametrize("fn, shapes", [
    (_fn_shapes, [(2, 60)]),
    (_fn_math, [(4, 8)]),
    (_fn_matmul, [(2, 5, 8), (2, 5, 8)]),
    (_fn_conv, [(1, 12, 10, 4)]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_tf_function_ops_match_tensorflow(fn, shapes):
    inputs = _inputs(5, *shapes)
    _check(tf.function(fn), inputs)


def test_gather_with_index_input():
    x = _inputs(6, (3, 5))[0]
    idx = np.array([[4, 0], [1, 1]], np.int64)
    _check(tf.function(_fn_gather), [x, idx])


def test_saved_model_directory(tmp_path):
    keras.utils.set_random_seed(0)

    class Small(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(np.random.default_rng(7).standard_normal((6, 3)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([2, 6], tf.float32)])
        def __call__(self, x):
            return {"y": tf.nn.tanh(x @ self.w)}

    mod = Small()
    tf.saved_model.save(mod, str(tmp_path / "sm"))
    x = _inputs(8, (2, 6))[0]
    compiled = cuvil.compile(str(tmp_path / "sm"), [x])
    assert [n for n, _ in compiled.outputs] == ["y"]
    ref = mod(x)["y"].numpy()
    np.testing.assert_allclose(compiled(x)[0], ref, atol=REL_TOL * np.abs(ref).max(), rtol=0)


def test_unsupported_op_names_the_op_node_and_line():
    def f(x):
        return tf.math.cumsum(x, axis=1) + 1.0
    with pytest.raises(UnsupportedOpError, match=r"unsupported TensorFlow op Cumsum \(node 'Cumsum' \(Cumsum\)\) "
                                                 r"at test_tf\.py:\d+ in f"):
        capture_tf(tf.function(f), _inputs(0, (2, 3)))


def test_compile_stage_runs_without_tensorflow(tmp_path):
    """Capture needs TensorFlow; compiling and running the .cvir must not import it."""
    model = keras_encoder_block(batch=1, seq=8, dim=16, heads=2)
    x = _inputs(9, (1, 8, 16))[0]
    cvir, xin, out = tmp_path / "m.cvir", tmp_path / "x.npy", tmp_path / "y.npy"
    cuvil.capture(model, [x], cvir)
    np.save(xin, x)
    code = ("import sys\n"
            "for m in ('tensorflow', 'keras', 'tf_keras', 'torch'): sys.modules[m] = None\n"
            "import numpy as np, cuvil\n"
            f"c = cuvil.compile(cuvil.load_ir({str(cvir)!r}))\n"
            f"np.save({str(out)!r}, c(np.load({str(xin)!r}))[0])\n"
            "assert not any(k.startswith(('tensorflow', 'keras')) for k, v in sys.modules.items() if v)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "compiler")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    ref = model(x, training=False).numpy()
    assert np.abs(np.load(out) - ref).max() <= REL_TOL * np.abs(ref).max()


MODEL_PY = '''\
import numpy as np
import keras


def cuvil_entry():
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3), batch_size=1)
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inp)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inp, keras.layers.Dense(5)(x))
    return model, [np.random.default_rng(1).standard_normal((1, 8, 8, 3)).astype(np.float32)]
'''
CONFIG = '''\
model:
  framework: tensorflow
  name: tiny_keras
  source: model.py
  entry: cuvil_entry
inputs:
  - name: image
    shape: [1, 8, 8, 3]
outputs:
  - name: scores
'''


def test_cuvil_build_with_framework_tensorflow(tmp_path):
    from cuvil.build import build
    from cuvil.config import load_config
    (tmp_path / "model.py").write_text(MODEL_PY)
    (tmp_path / "config.yaml").write_text(CONFIG)
    exe = build(load_config(tmp_path / "config.yaml"), tmp_path / "tiny", cache_dir=tmp_path / "cache",
                log=lambda s: None)
    sys.path.insert(0, str(tmp_path))
    try:
        import model as user_model
        model, (x,) = user_model.cuvil_entry()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("model", None)
    np.save(tmp_path / "x.npy", x)
    subprocess.run([str(exe), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")], check=True)
    ref = model(x).numpy()
    got = np.load(tmp_path / "y.npy")
    assert got.shape == ref.shape and np.abs(got - ref).max() <= REL_TOL * np.abs(ref).max()
    manifest = json.loads(next((tmp_path / "cache" / "compile").glob("*/tiny_keras.json")).read_text())
    assert manifest["inputs"] == [{"name": "image", "shape": [1, 8, 8, 3], "dtype": "f32"}]
