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

import numpy as np

from ..errors import FrontendError, UnsupportedOpError
from ..ir import Function, Value
from .graph import write_row
from .torch_ops import HANDLERS


def _constant(v) -> bool:
    return isinstance(v, Value) and v.defining_op is not None and v.defining_op.name == "cuvil.constant"


def lower_graph(low, sub, gm, name: str) -> list[Value]:
    """Lower the nodes of GraphModule gm in `sub` (its placeholders already bound); the
    tensors it returns. `low` takes over the constant count."""
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
    return outs


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
    outs = lower_graph(low, sub, gm, name)
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


def _scan(low, a):
    """scan(combine_fn, init, xs, additional): a cuvil.while over (step, carry..., ys...),
    the ys being carried [length, ...] buffers whose row `step` the body writes; xs and
    the additional inputs are invariants (constants among the latter sunk)."""
    gm, init, xs, extra = a["args"][:4]
    init, xs, extra = list(init), list(xs), list(extra)
    if not xs or not all(isinstance(x, Value) and x.type.rank and isinstance(x.shape[0], int) for x in xs):
        raise UnsupportedOpError("scan needs tensors with a static leading dim to scan over")
    length = xs[0].shape[0]
    n_c = len(init)
    val = low.meta()
    ys_t = [low.tensor_type(t) for t in list(val)[n_c:]]
    bufs = [low.const(np.zeros([int(d) for d in t.shape], t.np_dtype)) for t in ys_t]
    passed = [v for v in extra if not _constant(v)]
    carried = [low.const(np.int64(0)), *init, *bufs]
    names = ["step", *[f"carry{k}" for k in range(n_c)], *[f"ys{k}" for k in range(len(bufs))],
             *[f"xs{k}" for k in range(len(xs))], *[f"extra{k}" for k in range(len(passed))]]
    types = [v.type for v in [*carried, *xs, *passed]]

    cond = low.sub(Function("cond", names, types))
    cond.b.op_multi("cuvil.return", cond.op("cuvil.lt", cond.fn.args[0], cond.const(np.int64(length))))
    cond.fn.output_names = ["cond0"]

    body = low.sub(Function("body", names, types))
    args = body.fn.args
    step, carry_in = args[0], args[1:1 + n_c]
    buf_in = args[1 + n_c:1 + n_c + len(bufs)]
    xs_in = args[1 + n_c + len(bufs):1 + n_c + len(bufs) + len(xs)]
    passed_in = iter(args[1 + n_c + len(bufs) + len(xs):])
    placeholders = [p for p in gm.graph.nodes if p.op == "placeholder"]
    if len(placeholders) != n_c + len(xs) + len(extra):
        raise FrontendError(f"the scan function takes {len(placeholders)} inputs, the op passes "
                            f"{n_c + len(xs) + len(extra)}")
    bound = [*carry_in, *[body.op("cuvil.gather", x, step, axis=0) for x in xs_in],
             *[body.b.constant(v.defining_op.value, v.defining_op.attrs["name"]) if _constant(v) else next(passed_in)
               for v in extra]]
    for p, v in zip(placeholders, bound):
        body.env[p] = v
    outs = lower_graph(low, body, gm, "scan")
    nxt = [body.op("cuvil.add", step, body.const(np.int64(1))), *outs[:n_c],
           *[write_row(body, b, y, step) for b, y in zip(buf_in, outs[n_c:])]]
    body.b.loc = ""
    body.b.op_multi("cuvil.return", *nxt)
    body.fn.output_names = [f"body{k}" for k in range(len(nxt))]
    results = low.b.control("cuvil.while", [*carried, *xs, *passed], [cond.fn, body.fn], [v.type for v in carried],
                            carried=len(carried))
    return tuple(results[1:])


HANDLERS["cond"] = _cond
HANDLERS["while_loop"] = _while_loop
HANDLERS["scan"] = _scan
