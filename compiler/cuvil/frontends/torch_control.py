"""torch.export's control-flow operators -> cuvil.if / cuvil.while (ir/ops/control.py).

`torch.cond(pred, true_fn, false_fn, operands)` and
`torch._higher_order_ops.while_loop(cond_fn, body_fn, carried, additional)` reach the
exported graph as higher-order operators whose functions are GraphModules (get_attr
nodes) taking every tensor they read as an explicit input, parameters included. Each
becomes a region lowered like the main graph; an input that is a constant (a parameter,
a buffer) is re-created inside the region under its own name rather than passed in, so
that the region's kernels see their weights as constants (packed, folded) as they would
outside. Python-level loops are unrolled by torch.export and never get here.
"""
from __future__ import annotations

from ..errors import FrontendError
from ..ir import Function, Value
from .torch_ops import HANDLERS


def _constant(v) -> bool:
    return isinstance(v, Value) and v.defining_op is not None and v.defining_op.name == "cuvil.constant"


def lower_region(low, gm, name: str, inputs: list, sink: list[bool]) -> Function:
    """The GraphModule gm as a region; `inputs` are the outer values for its placeholders,
    and those marked in `sink` that are constants are re-created inside it instead."""
    import torch.fx
    if not isinstance(gm, torch.fx.GraphModule):
        raise FrontendError(f"the {name} function of a control-flow op is not a graph ({type(gm).__name__})")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise FrontendError(f"the {name} graph takes {len(placeholders)} inputs, the op passes {len(inputs)}")
    for v in inputs:
        if not isinstance(v, Value):
            raise FrontendError(f"the {name} graph is passed {v!r}: only tensors can enter a control-flow op")
    kept = [(p, v) for p, v, s in zip(placeholders, inputs, sink) if not (s and _constant(v))]
    fn = Function(name, [p.name for p, _ in kept], [v.type for _, v in kept])
    if low.fn.attrs.get("dim_bounds"):
        fn.attrs["dim_bounds"] = low.fn.attrs["dim_bounds"]
    sub = low.sub(fn)
    args = iter(fn.args)
    for p, v, s in zip(placeholders, inputs, sink):
        if s and _constant(v):
            sub.env[p] = sub.b.constant(v.defining_op.value, v.defining_op.attrs["name"])
        else:
            sub.env[p] = next(args)
    outs = None
    for node in gm.graph.nodes:
        if node.op == "call_function":
            sub.lower_node(node)
        elif node.op == "get_attr":
            sub.env[node] = getattr(gm, node.target)
        elif node.op == "output":
            outs = sub.value(node.args[0])
    low._n = sub._n
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    if not all(isinstance(v, Value) for v in outs):
        raise FrontendError(f"the {name} graph returns something other than tensors")
    fn.output_names = [f"{name}{i}" for i in range(len(outs))]
    sub.b.loc = ""
    sub.b.op_multi("cuvil.return", *outs)
    return fn


def _passed(inputs: list, sink: list[bool]) -> list[Value]:
    return [v for v, s in zip(inputs, sink) if not (s and _constant(v))]


def _cond(low, a):
    pred, true_gm, false_gm, operands = a["args"][:4]
    operands = list(operands)
    sink = [True] * len(operands)
    then = lower_region(low, true_gm, "then", operands, sink)
    other = lower_region(low, false_gm, "else", operands, sink)
    if not isinstance(pred, Value):
        raise FrontendError("torch.cond's predicate is not a tensor")
    return tuple(low.b.control("cuvil.if", [pred, *_passed(operands, sink)], [then, other],
                               [v.type for v in then.outputs]))


def _while_loop(low, a):
    cond_gm, body_gm, carried, extra = a["args"][:4]
    inputs = [*carried, *extra]
    sink = [False] * len(carried) + [True] * len(extra)  # carried values change: never sunk
    cond = lower_region(low, cond_gm, "cond", inputs, sink)
    body = lower_region(low, body_gm, "body", inputs, sink)
    return tuple(low.b.control("cuvil.while", _passed(inputs, sink), [cond, body],
                               [v.type for v in carried], carried=len(carried)))


HANDLERS["cond"] = _cond
HANDLERS["while_loop"] = _while_loop
