"""TensorFlow / Keras frontend: a Keras model, a `tf.function`, a concrete function or a
SavedModel -> concrete function at the example inputs' shapes -> variables folded to
constants -> GraphDef -> Cuvil IR.

Each GraphDef node is lowered by a handler in `tf_ops.py` or `tf_shape_ops.py`, keyed by
the op type in the HANDLERS table of `tf_common.py`. Keras works in NHWC while Cuvil's
conv and pooling ops are NCHW: a 4-D tensor can be held in NCHW form (`Lowering.nchw`),
so convolutions, their bias, batch norm, activations, residual adds, padding and
pooling chain without transposes in between; a transpose is made only where an
NHWC-only consumer (a reshape, a dense layer, an output) needs it. Every lowered tensor
is checked against the shape and dtype TensorFlow inferred for it.

TensorFlow is imported only inside the functions here: the compile stage never needs it.
"""
from __future__ import annotations

import os
import re
import traceback
from typing import Sequence

import numpy as np

from ..errors import CuvilError, FrontendError, UnsupportedOpError
from ..ir import Function, Module, TensorType, Value
from .graph import GraphLowering, check_type
from .tf_common import HANDLERS, NCHW, NCHW_TO_NHWC, NHWC_TO_NCHW, TF_DTYPES, cuvil_dtype


def handlers() -> dict:
    """Op type -> handler, for every op the frontend lowers. The handler modules fill the
    table when imported: here, not at the top, so that importing this module stays cheap."""
    from . import tf_control, tf_ops, tf_shape_ops  # noqa: F401
    return HANDLERS


def is_tensorflow_model(obj) -> bool:
    """A Keras model/layer, a tf.function, a concrete function or a SavedModel directory
    (checked without importing TensorFlow)."""
    if isinstance(obj, (str, os.PathLike)):
        return os.path.isfile(os.path.join(obj, "saved_model.pb"))
    mods = [c.__module__ for c in type(obj).__mro__]
    return any(m.split(".")[0] in ("keras", "tensorflow", "tf_keras") for m in mods)


class Node:
    """One GraphDef node: its type, name, data inputs ('name:index') and attributes."""

    def __init__(self, nd):
        self.nd = nd
        self.op = nd.op
        self.name = nd.name
        self.inputs = [_tensor_key(i) for i in nd.input if not i.startswith("^")]

    def attr(self, key: str, default=None):
        if key not in self.nd.attr:
            return default
        return _attr_value(self.nd.attr[key])

    def __str__(self) -> str:
        return f"node {self.name!r} ({self.op})"


def _tensor_key(name: str) -> tuple[str, int]:
    base, _, idx = name.partition(":")
    return base, int(idx) if idx else 0


def _attr_value(av):
    kind = av.WhichOneof("value")
    if kind == "list":
        lst = av.list
        for field in ("i", "f", "s", "b", "type"):
            vals = list(getattr(lst, field))
            if vals:
                return [v.decode() if isinstance(v, bytes) else v for v in vals]
        return []
    if kind == "s":
        return av.s.decode()
    if kind == "tensor":
        import tensorflow as tf
        return tf.make_ndarray(av.tensor)
    if kind == "shape":
        return None if av.shape.unknown_rank else [d.size for d in av.shape.dim]
    return getattr(av, kind) if kind else None


class Lowering(GraphLowering):
    """GraphLowering plus the TF tensor environment with NCHW twins of 4-D tensors."""

    def __init__(self, fn: Function):
        super().__init__(fn)
        self.env: dict[tuple[str, int], Value] = {}
        self.nchw_env: dict[tuple[str, int], Value] = {}
        self.nodes: dict[str, Node] = {}
        self.consumers: dict[str, list[Node]] = {}
        self.pending: dict[str, object] = {}  # results computed early, by node name

    def has_nchw(self, key) -> bool:
        return key in self.nchw_env

    # -- the regions of control-flow ops (tf_control.py) ------------------------------------
    def sub(self, fn: Function, fg) -> "Lowering":
        """A lowering of function graph fg into fn (a region), sharing constant names."""
        sub = Lowering(fn)
        sub._names, sub.symbolic = self._names, self.symbolic  # constant names stay unique module-wide
        sub.graph, sub.library, sub.root = fg, self.library, self.root
        return sub

    def lower_function_graph(self, fg, bind: list[Value], loc: str) -> list[Value]:
        """Lower the nodes of function graph fg here, its inputs bound to `bind`; its outputs."""
        nodes = [Node(nd) for nd in fg.as_graph_def().node]
        self.nodes = {n.name: n for n in nodes}
        for n in nodes:
            for src, _ in n.inputs:
                self.consumers.setdefault(src, []).append(n)
        in_keys = [_tensor_key(t.name) for t in fg.inputs]
        for k, v in zip(in_keys, bind):
            self.env[k] = v
        inputs = {k[0] for k in in_keys}
        for node in _topological(nodes):
            if node.name not in inputs:
                _lower_node(self, fg, node, loc)
        outs = [self.get(_tensor_key(t.name)) for t in fg.outputs]
        self.b.loc = loc
        return outs

    def get(self, key) -> Value:
        """A tensor in TensorFlow's own layout (made from its NCHW twin on first use)."""
        if key not in self.env:
            if key not in self.nchw_env:
                raise FrontendError(f"tensor {key[0]}:{key[1]} is used but was not produced")
            self.env[key] = self.transpose(self.nchw_env[key], NCHW_TO_NHWC)
        return self.env[key]

    def nchw(self, key) -> Value:
        """A 4-D NHWC tensor in NCHW form."""
        if key not in self.nchw_env:
            v = self.get(key)
            if v.type.rank != 4:
                raise UnsupportedOpError(f"expected a 4-D NHWC tensor, got {v.type}")
            self.nchw_env[key] = self.transpose(v, NHWC_TO_NCHW)
        return self.nchw_env[key]

    def to_nchw(self, v: Value) -> Value:
        """Any operand of an elementwise op on NCHW data, in NCHW form (rank <= 4)."""
        if v.type.rank > 4:
            raise UnsupportedOpError(f"cannot broadcast {v.type} against a 4-D tensor")
        v = self.reshape(v, [1] * (4 - v.type.rank) + list(v.shape))
        return self.transpose(v, NHWC_TO_NCHW)


# -- capture -----------------------------------------------------------------------------------
def _concrete_function(model, example_inputs):
    """(concrete function, input names, an object to keep alive while it is used) for a
    Keras model, tf.function, concrete function, plain function or SavedModel directory."""
    import tensorflow as tf
    specs = [tf.TensorSpec(np.shape(x), tf.as_dtype(np.asarray(x).dtype)) for x in example_inputs]
    if isinstance(model, (str, os.PathLike)):
        loaded = tf.saved_model.load(str(model))
        if "serving_default" not in loaded.signatures:
            raise FrontendError(f"SavedModel {model} has no 'serving_default' signature")
        cf = loaded.signatures["serving_default"]
        return cf, sorted(cf.structured_input_signature[1]), loaded  # loaded owns the variables
    if hasattr(model, "structured_input_signature") and hasattr(model, "graph"):
        return model, None, None  # already a concrete function
    try:
        import keras
        is_keras = isinstance(model, keras.layers.Layer)
    except ImportError:
        is_keras = False
    if is_keras:
        def call(*xs):
            return model(xs[0] if len(xs) == 1 else list(xs), training=False)
        fn = tf.function(call, autograph=False)
    elif hasattr(model, "get_concrete_function"):
        fn = model
    elif callable(model):
        fn = tf.function(model, autograph=False)
    else:
        raise FrontendError(f"cannot capture a {type(model).__name__} with TensorFlow")
    return fn.get_concrete_function(*specs), None, None


def _frozen_graph(cf):
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    try:
        frozen = convert_variables_to_constants_v2(cf, lower_control_flow=False)  # keep If/While
    except Exception as e:  # TF raises many types; the user needs the message
        raise FrontendError(f"folding the variables to constants failed: {type(e).__name__}: {e}") from e
    return frozen


def _user_frame(graph, name: str, outer: set) -> str:
    """'file.py:LINE in fn' of the user code that created op `name`: outside TF, Keras and
    Cuvil, and not a frame of the code that called the capture (`outer`)."""
    try:
        tb = graph.get_operation_by_name(name).traceback
    except (KeyError, ValueError, AttributeError):
        return ""
    frames = [f for f in (tb or []) if (f.filename, f.lineno) not in outer
              and not re.search(r"[/\\](tensorflow|keras|tf_keras|cuvil)[/\\]", f.filename)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}"


def _topological(nodes: list[Node]) -> list[Node]:
    by_name = {n.name: n for n in nodes}
    deps = {n.name: [i for i, _ in n.inputs] for n in nodes}
    order, state = [], {}
    for root in nodes:
        stack = [(root.name, False)]
        while stack:
            name, done = stack.pop()
            if done:
                if state.get(name) != 2:
                    state[name] = 2
                    order.append(by_name[name])
                continue
            if state.get(name):
                continue
            state[name] = 1
            stack.append((name, True))
            for d in deps.get(name, []):
                if d not in by_name:
                    raise FrontendError(f"node {name!r} reads {d!r}, which is not in the graph")
                if not state.get(d):
                    stack.append((d, False))
    return order


def capture_tf(model, example_inputs: Sequence, *, name_inputs: Sequence[str] | None = None) -> Module:
    """Trace `model` at the example inputs' shapes with TensorFlow and lower it."""
    outer = {(f.filename, f.lineno) for f in traceback.extract_stack()}
    example_inputs = [np.asarray(x) for x in example_inputs]
    cf, sig_names, _owner = _concrete_function(model, example_inputs)
    frozen = _frozen_graph(cf)
    graph = frozen.graph
    gd = graph.as_graph_def()
    nodes = [Node(nd) for nd in gd.node]
    in_keys = [_tensor_key(t.name) for t in frozen.inputs]
    out_keys = [_tensor_key(t.name) for t in frozen.outputs]
    if len(in_keys) != len(example_inputs):
        raise FrontendError(f"the model takes {len(in_keys)} inputs, {len(example_inputs)} example inputs were given")
    types = []
    for t, x in zip(frozen.inputs, example_inputs):
        shape = t.shape.as_list() if t.shape.rank is not None else list(x.shape)
        if any(d is not None and d != e for d, e in zip(shape, x.shape)) or len(shape) != x.ndim:
            raise FrontendError(f"input {t.name}: the function takes shape {shape}, the example input has {list(x.shape)}")
        types.append(TensorType(tuple(int(d) for d in x.shape), cuvil_dtype(t.dtype)))
    names = list(name_inputs or sig_names or [k[0] for k in in_keys])
    fn = Function("main", names, types)
    low = Lowering(fn)
    low.graph = graph  # for the functions of If/While nodes (tf_control.py)
    low.nodes = {n.name: n for n in nodes}
    for n in nodes:
        for src, _ in n.inputs:
            low.consumers.setdefault(src, []).append(n)
    for k, arg in zip(in_keys, fn.args):
        low.env[k] = arg
    inputs = set(k[0] for k in in_keys)
    for node in _topological(nodes):
        if node.name in inputs:
            continue
        _lower_node(low, graph, node, _user_frame(cf.graph, node.name, outer))
    outs = [low.get(k) for k in out_keys]
    out_names = _output_names(cf, len(outs))
    return low.finish(outs, out_names)


def _output_names(cf, n: int) -> list[str]:
    struct = cf.structured_outputs
    if isinstance(struct, dict) and len(struct) == n:
        return sorted(struct)  # TF flattens dicts in key order
    return ["output"] if n == 1 else [f"output{i}" for i in range(n)]


def _lower_node(low: Lowering, graph, node: Node, loc: str) -> None:
    low.b.loc, low.where, low.node_name = loc, str(node), _const_name(node.name)
    handler = handlers().get(node.op)
    if handler is None:
        raise UnsupportedOpError(f"unsupported TensorFlow op {node.op} ({node})" + (f" at {loc}" if loc else ""))
    try:
        results = handler(low, node)
    except CuvilError as e:
        raise type(e)(f"{e} (lowering {node}" + (f" at {loc})" if loc else ")")) from None
    except Exception as e:
        raise FrontendError(f"cannot lower {node}: {type(e).__name__}: {e}" + (f" at {loc}" if loc else "")) from e
    if results is None:
        return
    if not isinstance(results, (list, tuple)):
        results = [results]
    tf_outputs = graph.get_operation_by_name(node.name).outputs
    for i, r in enumerate(results):
        if r is None:
            continue
        key = (node.name, i)
        if key in low.env or key in low.nchw_env:
            raise FrontendError(f"internal: {node} output {i} was lowered twice")
        t = tf_outputs[i] if i < len(tf_outputs) else None
        shape = t.shape.as_list() if t is not None and t.shape.rank is not None else None
        dtype = TF_DTYPES.get(t.dtype.name) if t is not None else None
        if isinstance(r, NCHW):
            low.nchw_env[key] = r.value
            if shape is not None and len(shape) == 4:
                shape = [shape[p] for p in NHWC_TO_NCHW]
            check_type(r.value, shape, dtype, f"{node} output {i} (NCHW)")
        else:
            low.env[key] = r
            check_type(r, shape, dtype, f"{node} output {i}")


def _const_name(node_name: str) -> str:
    """Keras variable reads are 'layer/kernel/ReadVariableOp/resource': keep 'layer/kernel'."""
    return re.sub(r"(/ReadVariableOp)?(/resource)?$", "", node_name)
