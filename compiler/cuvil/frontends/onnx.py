"""ONNX frontend: `onnx.load` -> Cuvil IR.

Each node is lowered by a handler in `onnx_ops.py` or `onnx_shape_ops.py`, keyed by op
type ('Conv') in the HANDLERS table of `onnx_common.py`; handlers see the model's opset
(attributes became inputs over the versions: Slice, Reshape, ReduceSum, Clip, ...).
Initializers become `cuvil.constant`s named after them. ONNX is NCHW like Cuvil's conv
and pooling ops, so no layout change is needed. Inputs take their shapes from the
example inputs (or the model's declared static shapes); shape computations inside the
graph fold to constants (see graph.py).

The onnx package is imported only inside the functions here.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..errors import CuvilError, FrontendError, UnsupportedOpError
from ..ir import Function, Module, TensorType, Value
from .graph import GraphLowering, check_type
from .onnx_common import HANDLERS, cuvil_dtype


def handlers() -> dict:
    """Op type -> handler, for every op the frontend lowers. The handler modules fill the
    table when imported: here, not at the top, so that importing this module stays cheap."""
    from . import onnx_control, onnx_dynamic, onnx_ops, onnx_shape_ops  # noqa: F401
    return HANDLERS


def is_onnx_model(obj) -> bool:
    """An onnx.ModelProto or a path to a .onnx file (checked without importing onnx)."""
    if isinstance(obj, (str, os.PathLike)):
        return str(obj).endswith(".onnx")
    return type(obj).__name__ == "ModelProto" and type(obj).__module__.startswith("onnx")


class Node:
    """One NodeProto with its attributes decoded."""

    def __init__(self, proto):
        from onnx import helper
        self.proto = proto
        self.op = proto.op_type
        self.domain = proto.domain
        self.name = proto.name
        self.inputs = list(proto.input)
        self.outputs = list(proto.output)
        self.attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
        for k, v in self.attrs.items():
            if isinstance(v, bytes):
                self.attrs[k] = v.decode()
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                self.attrs[k] = [s.decode() for s in v]

    def attr(self, key: str, default=None):
        return self.attrs.get(key, default)

    def __str__(self) -> str:
        label = f"node {self.name!r}" if self.name else f"node producing {self.outputs[0]!r}"
        return f"{label} ({self.op})"


class Lowering(GraphLowering):
    def __init__(self, fn: Function, opset: int):
        super().__init__(fn)
        self.opset = opset
        self.env: dict[str, Value] = {}
        self.missing: dict[str, str] = {}  # outputs a handler does not produce -> why

    # -- the bodies of control-flow ops (onnx_control.py) ----------------------------------
    def sub(self, fn: Function) -> "Lowering":
        """A lowering into fn (a region) that shares this one's constant names."""
        sub = Lowering(fn, self.opset)
        sub._names = self._names  # constant names stay unique in the whole module
        return sub

    def lower_nodes(self, nodes, where: str) -> None:
        """Lower these NodeProtos here, in order."""
        for proto in nodes:
            _lower_node(self, Node(proto), where)

    def get(self, name: str) -> Value | None:
        """The value of tensor `name`; None for an omitted optional input ('')."""
        if not name:
            return None
        if name in self.missing:
            raise UnsupportedOpError(self.missing[name])
        if name not in self.env:
            raise FrontendError(f"tensor {name!r} is used before it is produced")
        return self.env[name]


def _load(model):
    import onnx
    if isinstance(model, (str, os.PathLike)):
        try:
            return onnx.load(str(model)), str(model)
        except (OSError, ValueError) as e:
            raise FrontendError(f"cannot read ONNX model {model}: {e}") from None
        except Exception as e:  # protobuf's DecodeError
            raise FrontendError(f"{model} is not a valid ONNX model: {type(e).__name__}: {e}") from None
    return model, ""


def _opset(model) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def _declared(value_info) -> tuple[list | None, int | None]:
    t = value_info.type
    if not t.HasField("tensor_type"):
        raise UnsupportedOpError(f"{value_info.name}: only tensor inputs and outputs are supported")
    tt = t.tensor_type
    shape = None
    if tt.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return shape, tt.elem_type or None


def _dim_params(value_info) -> list:
    """Each declared dim's dim_param name (None where it has none)."""
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        return []
    return [d.dim_param if d.HasField("dim_param") else None for d in tt.shape.dim]


def capture_onnx(model, example_inputs: Sequence = (), *, name_inputs: Sequence[str] | None = None,
                 dim_bounds: dict | None = None) -> Module:
    """Lower an ONNX ModelProto (or a .onnx path) at the example inputs' shapes.

    With `dim_bounds` ({name: (min, max)}), an input dim the model declares with that
    `dim_param` name stays symbolic (any size within the bounds at run time)."""
    from onnx import numpy_helper

    model, path = _load(model)
    where = f" in {path}" if path else ""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    graph_inputs = [i for i in graph.input if i.name not in inits]
    example_inputs = list(example_inputs)
    if example_inputs and len(example_inputs) != len(graph_inputs):
        raise FrontendError(f"the model takes {len(graph_inputs)} inputs "
                            f"({', '.join(i.name for i in graph_inputs)}), {len(example_inputs)} example inputs were given")
    types = []
    dim_bounds = dict(dim_bounds or {})
    used_dims: set[str] = set()
    for k, vi in enumerate(graph_inputs):
        shape, elem = _declared(vi)
        params = _dim_params(vi)
        if example_inputs:
            x = np.asarray(example_inputs[k])
            if shape is not None and (len(shape) != x.ndim or any(d not in (None, 0, e) for d, e in zip(shape, x.shape))):
                raise FrontendError(f"input {vi.name!r}: the model declares shape "
                                    f"{[d if d else '?' for d in shape]}, the example input has {list(x.shape)}")
            dims = x.shape
        else:
            if shape is None or any(not d and p not in dim_bounds for d, p in zip(shape, params + [None] * len(shape))):
                raise FrontendError(f"input {vi.name!r} has symbolic dims: give example inputs or bounds "
                                    "for its dim_params")
            dims = shape
        dims = [p if p in dim_bounds else int(d) for d, p in zip(dims, params + [None] * len(dims))]
        used_dims |= {d for d in dims if isinstance(d, str)}
        types.append(TensorType(tuple(dims), cuvil_dtype(elem)))
    unknown = sorted(set(dim_bounds) - used_dims)
    if unknown:
        raise FrontendError(f"dim_bounds names {', '.join(map(repr, unknown))}, but no input of the model "
                            "declares such a dim_param")
    fn = Function("main", list(name_inputs or [i.name for i in graph_inputs]), types)
    if used_dims:
        fn.attrs["dim_bounds"] = {d: [int(v) for v in dim_bounds[d]] for d in sorted(used_dims)}
    low = Lowering(fn, _opset(model))
    for vi, arg in zip(graph_inputs, fn.args):
        low.env[vi.name] = arg
    for name, t in inits.items():
        low.node_name = name
        low.env[name] = low.const(numpy_helper.to_array(t).copy(), name=name)
    for proto in graph.node:
        _lower_node(low, Node(proto), where)
    outs = []
    for vi in graph.output:
        v = low.get(vi.name)
        shape, elem = _declared(vi)
        if shape is not None and not example_inputs:
            check_type(v, shape, cuvil_dtype(elem) if elem else None, f"output {vi.name!r}")
        elif elem:
            check_type(v, None, cuvil_dtype(elem), f"output {vi.name!r}")
        outs.append(v)
    return low.finish(outs, [vi.name for vi in graph.output])


def _lower_node(low: Lowering, node: Node, where: str) -> None:
    low.where, low.node_name = str(node), node.outputs[0] if node.outputs else node.name
    if node.domain not in ("", "ai.onnx"):
        raise UnsupportedOpError(f"unsupported ONNX op {node.domain}.{node.op} ({node}){where}")
    handler = handlers().get(node.op)
    if handler is None:
        raise UnsupportedOpError(f"unsupported ONNX op {node.op} ({node}){where}")
    try:
        results = handler(low, node)
    except CuvilError as e:
        raise type(e)(f"{e} (lowering {node}{where})") from None
    except Exception as e:
        raise FrontendError(f"cannot lower {node}{where}: {type(e).__name__}: {e}") from e
    if not isinstance(results, (list, tuple)):
        results = [results]
    for i, name in enumerate(node.outputs):
        if not name:
            continue
        r = results[i] if i < len(results) else None
        if r is None:
            low.missing[name] = f"output {i} ({name!r}) of {node} is not supported{where}"
        else:
            low.env[name] = r
