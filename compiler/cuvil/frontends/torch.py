"""PyTorch frontend: `torch.export.export` -> ATen graph -> Cuvil IR (no ONNX in between).

The exported graph keeps high-level ATen ops (conv2d, linear, batch_norm, ...); each is
lowered by a handler in `torch_ops.py`. Parameters and buffers become `cuvil.constant`s
named after the model's state-dict keys. Every node's lowered type is checked against the
shape and dtype torch recorded for it.
"""
from __future__ import annotations

import operator
import os
import re
from typing import Any, Sequence

import numpy as np

from ..errors import CuvilError, FrontendError, UnsupportedOpError
from ..ir import Builder, Function, Module, TensorType, Value, verify

TORCH_DTYPES = {"float32": "f32", "float16": "f16", "float64": "f64", "int64": "i64",
                "int32": "i32", "int8": "i8", "uint8": "u8", "bool": "bool"}


def cuvil_dtype(torch_dtype) -> str:
    key = str(torch_dtype).replace("torch.", "")
    if key not in TORCH_DTYPES:
        raise FrontendError(f"dtype {torch_dtype} is not supported")
    return TORCH_DTYPES[key]


def source_of(node) -> tuple[str, str]:
    """(short location 'file.py:LINE in fn', full user frame text) from a node's stack trace."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    # The user's frame: the innermost one outside torch itself (an op inside nn.Conv3d is
    # reported at the user's line that called the layer).
    user = [f for f in frames if not _is_torch_file(f[0])]
    if not (user or frames):
        return "", ""
    path, line, fn, code = (user or frames)[-1]
    return f"{os.path.basename(path)}:{line} in {fn}", f'{path}:{line} in {fn}: {code.strip()}'


def _is_torch_file(path: str) -> bool:
    import torch
    root = os.path.dirname(os.path.abspath(torch.__file__))
    return os.path.abspath(path).startswith(root + os.sep)


def op_key(target) -> str:
    """'aten::conv2d' style key of a call_function target."""
    if target is operator.getitem:
        return "getitem"
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.name
    return getattr(target, "__name__", str(target))


class Lowering:
    """State while lowering one exported graph."""

    def __init__(self, fn: Function):
        self.fn = fn
        self.b = Builder(fn.body)
        self.env: dict[Any, Any] = {}
        self.node = None
        self._names: set[str] = set()
        self._n = 0

    # helpers the handlers use ------------------------------------------------------
    def const(self, value, dtype: str | None = None, name: str = "") -> Value:
        from ..ir.types import DTYPES
        arr = np.asarray(value, dtype=DTYPES[dtype] if dtype else None)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)
        if not name or name in self._names:
            self._n += 1
            name = f"const.{self._n}"
        self._names.add(name)
        return self.b.constant(arr, name)

    def op(self, name: str, *operands: Value, **attrs) -> Value:
        return self.b.op(name, *operands, **attrs)

    def meta(self, node=None):
        return (node or self.node).meta.get("val")

    def meta_type(self, node=None) -> TensorType:
        v = self.meta(node)
        return TensorType(tuple(int(d) for d in v.shape), cuvil_dtype(v.dtype))

    def cast(self, v: Value, dtype: str) -> Value:
        return v if v.dtype == dtype else self.op("cuvil.cast", v, dtype=dtype)

    def reshape(self, v: Value, shape) -> Value:
        shape = [int(d) for d in shape]
        return v if list(v.shape) == shape else self.op("cuvil.reshape", v, shape=shape)

    def value(self, arg):
        """A node argument: Values for nodes, recursively for lists, as-is otherwise."""
        import torch.fx
        if isinstance(arg, torch.fx.Node):
            if arg not in self.env:
                raise FrontendError(f"value {arg.name} used before definition")
            return self.env[arg]
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.value(a) for a in arg)
        return arg


def bind(node, low: Lowering) -> dict[str, Any]:
    """Map a node's args and kwargs to schema argument names, with defaults filled in."""
    schema = getattr(node.target, "_schema", None)
    args = [low.value(a) for a in node.args]
    kwargs = {k: low.value(v) for k, v in node.kwargs.items()}
    if schema is None:
        return {"args": args, **kwargs}
    out = {}
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


def capture_torch(model, example_inputs: Sequence, *, name_inputs: Sequence[str] | None = None) -> Module:
    """Export `model` with torch.export at the example inputs' shapes and lower it."""
    import torch
    from . import torch_composite, torch_ops  # noqa: F401  (torch_composite registers handlers)
    from . import torch_hf  # noqa: F401  (registers the Hugging Face Transformers handlers)

    if isinstance(model, torch.nn.Module):
        model = model.eval()
    inputs = tuple(torch.as_tensor(x) if isinstance(x, np.ndarray) else x for x in example_inputs)
    try:
        with torch.no_grad():
            ep = torch.export.export(model, inputs)
    except Exception as e:  # torch raises many types; the user needs the message
        raise FrontendError(f"torch.export.export failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    sig = ep.graph_signature
    if getattr(sig, "buffers_to_mutate", None):
        raise FrontendError("the model mutates buffers in forward (call model.eval()?): "
                            + ", ".join(sig.buffers_to_mutate.values()))
    params = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
              **getattr(sig, "inputs_to_lifted_tensor_constants", {})}
    state = {**ep.state_dict, **getattr(ep, "constants", {})}
    graph = ep.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    user = [n for n in placeholders if n.name not in params]
    names = list(name_inputs) if name_inputs else [n.name for n in user]
    types = []
    for n in user:
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor):
            raise FrontendError(f"input {n.name}: only tensor inputs are supported")
        types.append(TensorType(tuple(int(d) for d in v.shape), cuvil_dtype(v.dtype)))
    fn = Function("main", names, types)
    low = Lowering(fn)
    for n, arg in zip(user, fn.args):
        low.env[n] = arg
    for n in placeholders:
        if n.name in params:
            t = state[params[n.name]]
            low.env[n] = low.const(t.detach().cpu().contiguous().numpy().copy(), name=params[n.name])
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        low.node = node
        loc, where = source_of(node)
        low.b.loc = loc
        key = op_key(node.target)
        handler = torch_ops.HANDLERS.get(key)
        if handler is None:
            raise UnsupportedOpError(f"unsupported op {node.target} ({key})"
                                     + (f" at {where}" if where else ""))
        try:
            result = handler(low, bind(node, low))
        except CuvilError as e:
            raise type(e)(f"{e} (lowering {node.target}" + (f" at {where})" if where else ")")) from None
        except Exception as e:
            raise FrontendError(f"cannot lower {node.target}: {type(e).__name__}: {e}"
                                + (f" at {where}" if where else "")) from e
        low.env[node] = result
        _check_against_torch(low, node, result, where)
    out_node = next(n for n in graph.nodes if n.op == "output")
    outs = []
    for a in _flatten(out_node.args[0]):
        v = low.value(a)
        if not isinstance(v, Value):
            raise FrontendError(f"model output {a!r} is not a tensor")
        outs.append(v)
    fn.output_names = [f"output{i}" for i in range(len(outs))] if len(outs) > 1 else ["output"]
    low.b.loc = ""
    low.b.op_multi("cuvil.return", *outs)
    module = Module()
    module.add(fn)
    verify(module)
    return module


def _flatten(x):
    if isinstance(x, (list, tuple)):
        for item in x:
            yield from _flatten(item)
    else:
        yield x


def _check_against_torch(low: Lowering, node, result, where: str) -> None:
    import torch
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and isinstance(result, Value):
        want = low.meta_type(node)
        if (want.shape, want.dtype) != (result.type.shape, result.type.dtype):
            raise FrontendError(f"internal: {node.target} lowered to {result.type}, torch says {want}"
                                + (f" at {where}" if where else ""))
