"""PyTorch frontend: `torch.export.export` -> ATen graph -> Cuvil IR (no ONNX in between).

The exported graph keeps high-level ATen ops (conv2d, linear, batch_norm, ...); each is
lowered by a handler in `torch_ops.py`, `torch_shape_ops.py`, `torch_composite.py`,
`torch_hf.py` or `torch_quant.py`, keyed by schema name in `torch_ops.HANDLERS`.
Parameters and buffers become `cuvil.constant`s named after the model's state-dict keys.
Every node's lowered type is checked against the shape and dtype torch recorded for it.
"""
from __future__ import annotations

import functools
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
    # Generated code ("<eval_with_key>.5", the graph of a torch.cond or while_loop) is not
    # the user's either.
    user = [f for f in frames if not _is_torch_file(f[0]) and not f[0].startswith("<")]
    if not (user or frames):
        return "", ""
    path, line, fn, code = (user or frames)[-1]
    return f"{os.path.basename(path)}:{line} in {fn}", f'{_shown_path(path)}:{line} in {fn}: {code.strip()}'


def _shown_path(path: str) -> str:
    """`path` relative to the working directory when it is under it, or when the same
    file is there under a tail of `path`: inside a Bazel action that is the
    workspace-relative path (`errs/unsup.py`), not the sandbox's absolute one nor the
    source tree's that its symlinks lead to."""
    return _relative_to_cwd(path, os.getcwd())


@functools.lru_cache(maxsize=256)
def _relative_to_cwd(path: str, cwd: str) -> str:
    if not os.path.isabs(path):
        return path
    if path.startswith(cwd + os.sep):
        return os.path.relpath(path, cwd)
    parts = path.split(os.sep)
    for i in range(1, len(parts)):
        tail = os.path.join(*parts[i:])
        try:
            if os.path.samefile(os.path.join(cwd, tail), path):
                return tail
        except OSError:
            continue
    return path


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
        self.symbols: dict[str, str] = {}  # torch's symbol (s0) -> the user's dim name (batch)
        self._names: set[str] = set()
        self._n = 0

    # helpers the handlers use ------------------------------------------------------
    def const(self, value, dtype: str | None = None, name: str = "") -> Value:
        from ..ir.types import DTYPES
        arr = np.asarray(value, dtype=DTYPES[dtype] if dtype else None)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)
        while not name or name in self._names:  # regions share _names but count on their own
            self._n += 1
            name = f"const.{self._n}"
        self._names.add(name)
        return self.b.constant(arr, name)

    def op(self, name: str, *operands: Value, **attrs) -> Value:
        return self.b.op(name, *operands, **attrs)

    def meta(self, node=None):
        return (node or self.node).meta.get("val")

    def meta_type(self, node=None) -> TensorType:
        return self.tensor_type(self.meta(node))

    def tensor_type(self, t) -> TensorType:
        """The Cuvil type of a torch (fake) tensor."""
        return TensorType(tuple(self.dim(d) for d in t.shape), cuvil_dtype(t.dtype))

    def dim(self, d):
        """An int, or a symbolic dim (torch SymInt) in Cuvil's names (see `symbols`)."""
        return dim_of(d, self.symbols)

    def cast(self, v: Value, dtype: str) -> Value:
        return v if v.dtype == dtype else self.op("cuvil.cast", v, dtype=dtype)

    # -- the regions of control-flow ops (torch_control.py) --------------------------------
    def sub(self, fn: Function) -> "Lowering":
        """A lowering into fn (a region) that shares this one's symbols and constant names."""
        sub = Lowering(fn)
        sub.symbols, sub._names, sub._n = self.symbols, self._names, self._n
        return sub

    def lower_node(self, node) -> None:
        _lower_node(self, node)

    def reshape(self, v: Value, shape) -> Value:
        shape = [self.dim(d) if not isinstance(d, str) else d for d in shape]
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


_TORCH_SYMBOL = re.compile(r"\b[su]\d+\b")


def dim_of(d, symbols: dict[str, str]):
    """A torch dim (int or SymInt) as a Cuvil dim: an int, or the canonical text of a
    polynomial in the user's dim names."""
    from ..ir import symdim
    if isinstance(d, int):
        return d
    expr = getattr(getattr(d, "node", None), "expr", None)
    if expr is None:
        return int(d)
    if getattr(expr, "is_number", False):
        return int(expr)
    text = str(expr)
    unknown = [s for s in _TORCH_SYMBOL.findall(text) if s not in symbols]
    if unknown:
        raise FrontendError(f"the size {text} depends on {unknown[0]}, which is not a dim of any input")
    named = _TORCH_SYMBOL.sub(lambda m: symbols[m.group(0)], text)
    try:
        return symdim.canonical(named)
    except Exception:
        raise UnsupportedOpError(f"the symbolic size {named} is not supported (sizes that are sums and "
                                 "products of input dims are)") from None


def _torch_dynamic_shapes(example_inputs, dynamic_shapes, dim_bounds):
    """torch.export's dynamic_shapes (one {axis: Dim} per input) for Cuvil's per-input dim
    names, with the bounds of each name."""
    import torch
    dims = {}
    out = []
    if len(dynamic_shapes) != len(example_inputs):
        raise FrontendError(f"dynamic_shapes names the dims of {len(dynamic_shapes)} inputs, the model has "
                            f"{len(example_inputs)}")
    for i, (x, spec) in enumerate(zip(example_inputs, dynamic_shapes)):
        axes = {}
        if spec is not None:
            if len(spec) != x.dim():
                raise FrontendError(f"input {i}: dynamic_shapes gives {len(spec)} dims, the example has shape "
                                    f"{list(x.shape)}")
            for ax, name in enumerate(spec):
                if not isinstance(name, str):
                    continue
                if name not in dim_bounds:
                    raise FrontendError(f"input {i}: the symbolic dim {name!r} has no bounds (dims: {{{name}: "
                                        "[min, max]}})")
                lo, hi = dim_bounds[name]
                if name not in dims:
                    dims[name] = torch.export.Dim(name, min=int(lo), max=int(hi))
                axes[ax] = dims[name]
        out.append(axes or None)
    return tuple(out)


def _for_signature(model, specs: tuple):
    """dynamic_shapes in the structure torch.export expects for forward's parameters: a
    forward(*xs) takes all inputs as one (tuple) argument."""
    import inspect
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return specs
    if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return (specs,)
    return specs


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


def handlers() -> dict:
    """ATen schema name -> handler, for every op the frontend lowers. The handler modules
    fill torch_ops.HANDLERS when imported: here, not at the top, so that importing this
    module stays cheap. (torch_hf's `index` replaces torch_composite's.)"""
    from . import (torch_composite, torch_control, torch_dynamic, torch_hf, torch_ops, torch_quant,  # noqa: F401
                   torch_shape_ops)
    return torch_ops.HANDLERS


def capture_torch(model, example_inputs: Sequence, *, name_inputs: Sequence[str] | None = None,
                  dynamic_shapes: Sequence | None = None, dim_bounds: dict | None = None) -> Module:
    """Export `model` with torch.export at the example inputs' shapes and lower it.

    `dynamic_shapes` (one entry per input: a list of dims, each an int or a symbol name such
    as "batch", or None for a static input) and `dim_bounds` ({name: (min, max)}) make dims
    symbolic: torch.export gets matching `Dim`s and the IR carries the names."""
    handlers()
    ep = _export(model, example_inputs, dynamic_shapes, dim_bounds)
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
    types, symbols = _input_types(user, names, dynamic_shapes)
    fn = Function("main", names, types)
    if symbols:
        fn.attrs["dim_bounds"] = _dim_bounds(ep, symbols, dim_bounds)
    low = Lowering(fn)
    low.symbols = symbols
    for n, arg in zip(user, fn.args):
        low.env[n] = arg
    for n in placeholders:
        if n.name in params:
            t = state[params[n.name]]
            low.env[n] = low.const(t.detach().cpu().contiguous().numpy().copy(), name=params[n.name])
    for node in graph.nodes:
        if node.op == "call_function":
            _lower_node(low, node)
        elif node.op == "get_attr":  # a subgraph of a control-flow op (torch_control.py)
            low.env[node] = getattr(ep.graph_module, node.target)
    return _finish(low, next(n for n in graph.nodes if n.op == "output"))


def _export(model, example_inputs: Sequence, dynamic_shapes: Sequence | None, dim_bounds: dict | None):
    """torch.export's ExportedProgram of `model` (in eval mode) at the example inputs."""
    import torch
    if isinstance(model, torch.nn.Module):
        try:
            model = model.eval()
        except NotImplementedError:  # an exported / PT2E-converted GraphModule is already eval-only
            pass
    inputs = tuple(torch.as_tensor(x) if isinstance(x, np.ndarray) else x for x in example_inputs)
    export_dynamic = None
    if dynamic_shapes is not None:
        export_dynamic = _for_signature(model, _torch_dynamic_shapes(inputs, dynamic_shapes, dict(dim_bounds or {})))
    try:
        with torch.no_grad():
            return torch.export.export(model, inputs, dynamic_shapes=export_dynamic)
    except Exception as e:  # torch raises many types; the user needs the message
        hint = ""
        for spec, x in zip(dynamic_shapes or (), inputs):
            ones = [d for d, n in zip(spec or (), getattr(x, "shape", ())) if isinstance(d, str) and n == 1]
            if ones:
                hint = (f" (the example input has size 1 in the symbolic dim {ones[0]!r}: torch.export "
                        "specialises such dims; give an example of size >= 2 there)")
                break
        raise FrontendError(f"torch.export.export failed: {type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}{hint}") from e


def _input_types(user: list, names: list[str], dynamic_shapes: Sequence | None) -> tuple[list, dict[str, str]]:
    """(the user inputs' types, torch's symbol -> the user's dim name) from the placeholders."""
    import torch
    types = []
    symbols: dict[str, str] = {}
    for i, n in enumerate(user):
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor):
            raise FrontendError(f"input {n.name}: only tensor inputs are supported")
        spec = list(dynamic_shapes[i] or []) if dynamic_shapes is not None else []
        for ax, d in enumerate(v.shape):
            if not isinstance(d, int) and ax < len(spec) and isinstance(spec[ax], str):
                symbols.setdefault(str(d.node.expr), spec[ax])
            elif not isinstance(d, int):  # torch made a dim symbolic that was not asked for
                raise FrontendError(f"input {names[i] if i < len(names) else n.name}: dim {ax} became symbolic "
                                    f"({d}) without a name in dynamic_shapes")
            elif ax < len(spec) and isinstance(spec[ax], str):
                raise FrontendError(f"input {names[i] if i < len(names) else n.name}: torch.export specialised "
                                    f"the dim {spec[ax]!r} to {d} (the model only works at that size, or the "
                                    "example input has size 1 there: give an example of size >= 2)")
        types.append(TensorType(tuple(dim_of(d, symbols) for d in v.shape), cuvil_dtype(v.dtype)))
    return types, symbols


def _dim_bounds(ep, symbols: dict[str, str], dim_bounds: dict) -> dict[str, list[int]]:
    """Each symbolic dim's [min, max]: the user's bounds, narrowed to torch's range."""
    bounds = {}
    ranges = {str(k): v for k, v in ep.range_constraints.items()}
    for sym, name in symbols.items():
        r = ranges.get(sym)
        lo, hi = dim_bounds[name]
        if r is not None:  # torch may narrow the range the user gave
            lo = max(int(lo), int(r.lower))
            hi = min(int(hi), int(r.upper)) if str(r.upper) not in ("oo", "int_oo") else int(hi)
        bounds[name] = [int(lo), int(hi)]
    return bounds


CONTROL_FLOW = ("cond", "while_loop", "scan")  # higher-order ops lowered by torch_control.py


def _lower_node(low: Lowering, node) -> None:
    """Lower one call_function node into low.env[node], checked against torch's type."""
    import torch

    from .torch_quant import check_operands
    low.node = node
    if type(node.meta.get("val")).__name__ in ("SymBool", "bool") and not isinstance(node.meta.get("val"), torch.Tensor):
        low.env[node] = None  # a check on sizes (u0 >= 0) that torch.export asserts: nothing to run
        return
    if not isinstance(node.meta.get("val"), (torch.Tensor, list, tuple, type(None))) and \
            type(node.meta.get("val")).__name__ in ("SymInt", "int"):
        # A size computation (sym_size, products of sizes): its value is the dim torch recorded.
        low.env[node] = low.dim(node.meta["val"])
        return
    loc, where = source_of(node)
    low.b.loc = loc
    key = op_key(node.target)
    handler = handlers().get(key)
    if handler is None:
        raise UnsupportedOpError(f"unsupported op {node.target} ({key})"
                                 + (f" at {where}" if where else ""))
    try:
        bound = bind(node, low)
        check_operands(key, bound)
        result = handler(low, bound)
    except CuvilError as e:
        if key in CONTROL_FLOW:  # the error is from inside one of its functions: name the op, briefly
            at = f" at {loc}" if loc and not loc.startswith("<") else ""
            raise type(e)(f"{e} (inside torch {key}{at})") from None
        raise type(e)(f"{e} (lowering {node.target}" + (f" at {where})" if where else ")")) from None
    except Exception as e:
        raise FrontendError(f"cannot lower {node.target}: {type(e).__name__}: {e}"
                            + (f" at {where}" if where else "")) from e
    low.env[node] = result
    _check_against_torch(low, node, result, where)


def _finish(low: Lowering, out_node) -> Module:
    """The function's return of the graph's outputs, in a verified module."""
    fn = low.fn
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
