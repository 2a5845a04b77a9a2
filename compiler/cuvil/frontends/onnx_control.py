"""ONNX control flow -> cuvil.if / cuvil.while (ir/ops/control.py).

`If`, `Loop` and `Scan` carry their bodies as GraphProto attributes, which may read any
tensor of the enclosing graphs by name. Each body becomes a region: a tensor it reads
from outside that is a constant (an initializer, a folded value) is re-created inside
under its own name; the others are passed in as operands, the same list for every
region of one op (a region's signature is the op's).

- `If` with a predicate known at compile time (shape checks in exported models) inlines
  the branch taken; otherwise both branches must give the same types.
- `Loop` is a `cuvil.while` over (iteration, condition, loop-carried values...). Its scan
  outputs (one slice per iteration, stacked) need the trip count `M` to be a constant
  and the condition to stay true (the number of slices is then M): each is a carried
  [M, ...] buffer whose row i the body writes.
- `Scan` (opset 9 and later) is a `cuvil.while` over its scan inputs' length: the body
  reads row i of each scan input (or row L-1-i, reversed) and writes row i of each scan
  output, transposed to `scan_output_axes` at the end.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Function, TensorType, Value
from .graph import const_array, write_row
from .onnx_common import handles, operand


def free_names(graph) -> list[str]:
    """The tensors a graph (its nested graphs included) reads from enclosing scopes, in
    order of first use."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    out: list[str] = []

    def use(name):
        if name and name not in defined and name not in out:
            out.append(name)
    for node in graph.node:
        for name in node.input:
            use(name)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == attr.GRAPH else list(attr.graphs)):
                for name in free_names(sub):
                    use(name)
        defined.update(o for o in node.output if o)
    return out


def _outer(low, graphs) -> tuple[list[tuple[str, Value]], dict[str, Value]]:
    """(tensors passed into the regions as operands, constants re-created inside them)."""
    passed, sunk = [], {}
    for g in graphs:
        for name in free_names(g):
            v = low.get(name)
            if name in sunk or any(n == name for n, _ in passed):
                continue
            if const_array(v) is not None:
                sunk[name] = v
            else:
                passed.append((name, v))
    return passed, sunk


def _region(low, graph, fn_name: str, args: list[tuple[str, TensorType]], sunk: dict[str, Value], *,
            bind: list[str] | None = None):
    """A Lowering for `graph` as a region named fn_name taking `args` (name, type): its
    env maps the graph's own inputs (`bind`: their names, in order, for the first args)
    and the outer names of the remaining args; sunk constants are re-created inside."""
    from onnx import numpy_helper

    fn = Function(fn_name, [n for n, _ in args], [t for _, t in args])
    if low.fn.attrs.get("dim_bounds"):
        fn.attrs["dim_bounds"] = low.fn.attrs["dim_bounds"]
    sub = low.sub(fn)
    bind = bind or []
    for k, (name, _) in enumerate(args):
        sub.env[bind[k] if k < len(bind) else name] = fn.args[k]
    for name, v in sunk.items():
        sub.node_name = name
        sub.env[name] = sub.b.constant(const_array(v), v.defining_op.attrs["name"])
    for t in graph.initializer:
        sub.node_name = t.name
        sub.env[t.name] = sub.const(numpy_helper.to_array(t).copy(), name=t.name)
    return sub


def _lower_body(sub, graph, where: str) -> list[Value]:
    sub.lower_nodes(graph.node, where)
    return [sub.get(o.name) for o in graph.output]


def _close(sub, outs: list[Value], prefix: str) -> Function:
    sub.b.loc = ""
    sub.b.op_multi("cuvil.return", *outs)
    sub.fn.output_names = [f"{prefix}{i}" for i in range(len(outs))]
    return sub.fn


def _scalar_bool(low, v: Value, what: str) -> Value:
    if v.type.numel != 1:
        raise UnsupportedOpError(f"{what} must have one element, not {v.type}")
    v = low.cast(v, "bool")
    return low.reshape(v, []) if v.type.rank else v


# -- If ------------------------------------------------------------------------------------------
@handles("If")
def _if(low, node):
    then_g, else_g = node.attr("then_branch"), node.attr("else_branch")
    for g in (then_g, else_g):
        for o in g.output:
            if not o.type.HasField("tensor_type"):
                raise UnsupportedOpError(f"If: branch output {o.name!r} is not a tensor (sequences and "
                                         "optionals are not supported)")
    pred = _scalar_bool(low, operand(low, node, 0), "If's condition")
    known = const_array(pred)
    if known is not None:  # decided at compile time: the taken branch, inline
        from onnx import numpy_helper
        g = then_g if bool(known) else else_g
        for t in g.initializer:
            low.env[t.name] = low.const(numpy_helper.to_array(t).copy(), name=t.name)
        return _lower_body(low, g, "")
    passed, sunk = _outer(low, [then_g, else_g])
    args = [(n, v.type) for n, v in passed]
    branches = []
    for g, name in ((then_g, "then"), (else_g, "else")):
        sub = _region(low, g, name, args, sunk)
        branches.append(_close(sub, _lower_body(sub, g, f" in the {name} branch"), name))
    t_then = [v.type for v in branches[0].outputs]
    t_else = [v.type for v in branches[1].outputs]
    if t_then != t_else:
        raise UnsupportedOpError(f"If: the branches give {', '.join(map(str, t_then))} and "
                                 f"{', '.join(map(str, t_else))}; both branches must give the same shapes")
    return low.b.control("cuvil.if", [pred, *[v for _, v in passed]], branches, t_then)


# -- Loop ----------------------------------------------------------------------------------------
def _identity_of(graph, out_name: str, in_name: str) -> bool:
    """Whether graph output out_name is graph input in_name (directly or by Identity)."""
    if out_name == in_name:
        return True
    return any(n.op_type == "Identity" and list(n.output) == [out_name] and list(n.input) == [in_name]
               for n in graph.node)


@handles("Loop")
def _loop(low, node):
    body = node.attr("body")
    m, c0 = operand(low, node, 0), operand(low, node, 1)
    init = [operand(low, node, k) for k in range(2, len(node.inputs))]
    n_state = len(init)
    n_scan = len(body.output) - 1 - n_state
    if len(body.input) != 2 + n_state or n_scan < 0:
        raise UnsupportedOpError(f"Loop: the body takes {len(body.input)} inputs and gives {len(body.output)} "
                                 f"outputs for {n_state} loop-carried values")
    i64, boolean = TensorType((), "i64"), TensorType((), "bool")
    limit = None if m is None else low.cast(low.reshape(m, []) if m.type.rank else m, "i64")
    c0 = low.const(True) if c0 is None else _scalar_bool(low, c0, "Loop's condition")
    trips = None
    if n_scan:
        always = const_array(c0) is not None and bool(const_array(c0)) and \
            _identity_of(body, body.output[0].name, body.input[1].name)
        if limit is None or const_array(limit) is None or not always:
            raise UnsupportedOpError("Loop with scan outputs needs a constant trip count M and a condition that "
                                     "stays true (the scan outputs' length is then M)")
        trips = max(int(const_array(limit)), 0)
    passed, sunk = _outer(low, [body])
    if limit is not None and const_array(limit) is None:
        passed.insert(0, ("\0limit", limit))
    elif limit is not None:
        sunk["\0limit"] = limit

    def scan_types():  # the scan outputs' per-iteration types: lower the body once to see them
        args = [("\0i", i64), ("\0c", boolean), *[(f"\0v{k}", v.type) for k, v in enumerate(init)],
                *[(n, v.type) for n, v in passed]]
        sub = _region(low, body, "probe", args, sunk, bind=[x.name for x in body.input])
        return [v.type for v in _lower_body(sub, body, "")[1 + n_state:]]
    scan_t = scan_types() if n_scan else []
    bufs = [low.const(np.zeros((trips, *t.shape), dtype=t.np_dtype)) for t in scan_t]
    carried = [low.const(np.int64(0)), c0, *init, *bufs]
    args = [("\0i", i64), ("\0c", boolean), *[(f"\0v{k}", v.type) for k, v in enumerate(init)],
            *[(f"\0s{k}", b.type) for k, b in enumerate(bufs)], *[(n, v.type) for n, v in passed]]

    cond = _region(low, body, "cond", args, sunk)
    go = cond.fn.args[1]
    if limit is not None:
        go = cond.op("cuvil.and", go, cond.op("cuvil.lt", cond.fn.args[0], cond.get("\0limit")))
    cond_fn = _close(cond, [go], "cond")

    sub = _region(low, body, "body", args, sunk, bind=[x.name for x in body.input])
    outs = _lower_body(sub, body, " in the Loop body")
    i = sub.fn.args[0]
    nxt = [sub.op("cuvil.add", i, sub.const(np.int64(1))), _scalar_bool(sub, outs[0], "the Loop body's condition")]
    for k, v in enumerate(outs[1:1 + n_state]):
        if v.type != init[k].type:
            raise UnsupportedOpError(f"Loop: loop-carried value {k} ({body.input[2 + k].name!r}) changes from "
                                     f"{init[k].type} to {v.type} in the body; its shape must stay the same")
        nxt.append(v)
    for k, v in enumerate(outs[1 + n_state:]):
        nxt.append(write_row(sub, sub.fn.args[2 + n_state + k], v, i))
    body_fn = _close(sub, nxt, "body")
    results = low.b.control("cuvil.while", [*carried, *[v for _, v in passed]], [cond_fn, body_fn],
                            [v.type for v in carried], carried=len(carried))
    return results[2:]


# -- Scan ----------------------------------------------------------------------------------------
@handles("Scan")
def _scan(low, node):
    if low.opset < 9:
        raise UnsupportedOpError("Scan before opset 9 (with sequence_lens) is not supported")
    body = node.attr("body")
    n_in = int(node.attr("num_scan_inputs"))
    values = [operand(low, node, k) for k in range(len(node.inputs))]
    state, xs = values[:len(values) - n_in], values[len(values) - n_in:]
    n_state = len(state)
    n_out = len(body.output) - n_state
    in_axes = [int(a) for a in node.attr("scan_input_axes", [0] * n_in)]
    in_dirs = [int(a) for a in node.attr("scan_input_directions", [0] * n_in)]
    out_axes = [int(a) for a in node.attr("scan_output_axes", [0] * n_out)]
    out_dirs = [int(a) for a in node.attr("scan_output_directions", [0] * n_out)]
    in_axes = [a + x.type.rank if a < 0 else a for a, x in zip(in_axes, xs)]
    lengths = {int(x.shape[a]) for a, x in zip(in_axes, xs)}
    if len(lengths) != 1:
        raise UnsupportedOpError(f"Scan: the scan inputs have different lengths {sorted(lengths)}")
    trips = lengths.pop()
    i64 = TensorType((), "i64")
    passed, sunk = _outer(low, [body])

    def bind_inputs(sub):
        """The body's scan-input names -> row i (or L-1-i) of each scan input."""
        i = sub.fn.args[0]
        rev = sub.op("cuvil.sub", sub.const(np.int64(trips - 1)), i)
        for k, x in enumerate(xs):
            full = sub.fn.args[1 + n_state + n_out_bufs + k]
            sub.env[body.input[n_state + k].name] = sub.op("cuvil.gather", full, rev if in_dirs[k] else i,
                                                           axis=in_axes[k])

    n_out_bufs = 0
    probe_args = [("\0i", i64), *[(f"\0v{k}", v.type) for k, v in enumerate(state)],
                  *[(f"\0x{k}", x.type) for k, x in enumerate(xs)], *[(n, v.type) for n, v in passed]]
    probe = _region(low, body, "probe", probe_args, sunk, bind=[""] + [x.name for x in body.input[:n_state]])
    bind_inputs(probe)
    scan_t = [v.type for v in _lower_body(probe, body, "")[n_state:]]
    bufs = [low.const(np.zeros((trips, *t.shape), dtype=t.np_dtype)) for t in scan_t]
    n_out_bufs = len(bufs)
    carried = [low.const(np.int64(0)), *state, *bufs]
    args = [("\0i", i64), *[(f"\0v{k}", v.type) for k, v in enumerate(state)],
            *[(f"\0s{k}", b.type) for k, b in enumerate(bufs)],
            *[(f"\0x{k}", x.type) for k, x in enumerate(xs)], *[(n, v.type) for n, v in passed]]

    cond = _region(low, body, "cond", args, sunk)
    cond_fn = _close(cond, [cond.op("cuvil.lt", cond.fn.args[0], cond.const(np.int64(trips)))], "cond")
    sub = _region(low, body, "body", args, sunk, bind=[""] + [x.name for x in body.input[:n_state]])
    bind_inputs(sub)
    outs = _lower_body(sub, body, " in the Scan body")
    i = sub.fn.args[0]
    nxt = [sub.op("cuvil.add", i, sub.const(np.int64(1)))]
    for k, v in enumerate(outs[:n_state]):
        if v.type != state[k].type:
            raise UnsupportedOpError(f"Scan: state {k} changes from {state[k].type} to {v.type} in the body")
        nxt.append(v)
    rev = sub.op("cuvil.sub", sub.const(np.int64(trips - 1)), i)
    for k, v in enumerate(outs[n_state:]):
        nxt.append(write_row(sub, sub.fn.args[1 + n_state + k], v, rev if out_dirs[k] else i))
    body_fn = _close(sub, nxt, "body")
    results = low.b.control("cuvil.while", [*carried, *xs, *[v for _, v in passed]], [cond_fn, body_fn],
                            [v.type for v in carried], carried=len(carried))
    finals, stacked = results[1:1 + n_state], results[1 + n_state:]
    outs = list(finals)
    for k, y in enumerate(stacked):
        axis = out_axes[k] + y.type.rank if out_axes[k] < 0 else out_axes[k]
        if axis:
            perm = list(range(1, y.type.rank))
            perm.insert(axis, 0)
            y = low.transpose(y, perm)
        outs.append(y)
    return outs

