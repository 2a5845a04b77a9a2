"""TensorFlow's functional control flow -> cuvil.if / cuvil.while (ir/ops/control.py).

`tf.cond` and `tf.while_loop` inside a tf.function reach the GraphDef as `If` /
`StatelessIf` (then_branch, else_branch) and `While` / `StatelessWhile` (cond, body)
nodes whose branches are FunctionDefs in the graph's function library (the capture
freezes the variables with `lower_control_flow=False`, so they are not rewritten into
Switch/Merge). Each function is rebuilt as a TensorFlow graph at the shapes of the
values it is passed (for TensorFlow's own shape inference, which every lowered tensor is
checked against) and lowered node by node into a region as the main graph is. An operand
that is a constant (a frozen variable, a shape) is re-created inside the region under its
own name rather than passed in, so that the region's kernels see their weights as
constants, as they would outside.

`While` passes every captured tensor as a loop variable that the body returns unchanged:
those become the loop's invariants, the others its carried values. Loop variables must
keep their shape across iterations. An `If` whose predicate is known at capture time is
replaced by the branch it takes.
"""
from __future__ import annotations

from ..errors import UnsupportedOpError
from ..ir import Function, Value
from .graph import const_array
from .tf_common import handles


def _library(low) -> dict:
    """Function name -> FunctionDef of the captured graph (shared by nested lowerings)."""
    lib = getattr(low, "library", None)
    if lib is None:
        lib = low.library = {f.signature.name: f for f in low.graph.as_graph_def().library.function}
        low.root = low.graph
    return lib


def _function_graph(low, fname: str, inputs: list[Value]):
    """The FunctionDef `fname` as a TensorFlow graph whose inputs have these values' shapes."""
    import tensorflow as tf
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph
    lib = _library(low)
    if fname not in lib:
        raise UnsupportedOpError(f"function {fname!r} is not in the graph's function library")
    fdef = lib[fname]
    if len(fdef.signature.input_arg) != len(inputs):
        raise UnsupportedOpError(f"function {fname} takes {len(fdef.signature.input_arg)} inputs, "
                                 f"the op passes {len(inputs)}")
    shapes = [tf.TensorShape([d if isinstance(d, int) else None for d in v.shape]) for v in inputs]
    with low.root.as_default():
        return fdef, function_def_to_graph(fdef, input_shapes=shapes)


def _constant(v: Value) -> bool:
    return const_array(v) is not None


def _region(low, fname: str, what: str, inputs: list[Value], sink: list[bool], order: list[int] | None = None,
            keep: list[int] | None = None, graph=None) -> Function:
    """FunctionDef `fname` as a region. `inputs` are the outer values for its inputs (in
    the function's order); those marked in `sink` that are constants are re-created inside
    instead of passed. The region's arguments are the rest in `order` (default: as they
    come); it returns the function's outputs `keep` (default: all). `graph`: the
    (FunctionDef, function graph) pair if already built."""
    fdef, fg = graph or _function_graph(low, fname, inputs)
    order = list(range(len(inputs))) if order is None else order
    arg_names = [a.name for a in fdef.signature.input_arg]
    passed = [i for i in order if not (sink[i] and _constant(inputs[i]))]
    fn = Function(what, [arg_names[i] for i in passed], [inputs[i].type for i in passed])
    if low.fn.attrs.get("dim_bounds"):
        fn.attrs["dim_bounds"] = low.fn.attrs["dim_bounds"]
    sub = low.sub(fn, fg)
    bind: list = [None] * len(inputs)
    for i, arg in zip(passed, fn.args):
        bind[i] = arg
    for i, v in enumerate(inputs):
        if bind[i] is None:
            c = v.defining_op
            bind[i] = sub.b.constant(c.value, c.attrs["name"])
    outs = sub.lower_function_graph(fg, bind, low.b.loc)
    outs = outs if keep is None else [outs[i] for i in keep]
    fn.output_names = [f"{what}{i}" for i in range(len(outs))]
    sub.b.loc = ""
    sub.b.op_multi("cuvil.return", *outs)
    return fn


def _func(node, key: str) -> str:
    """The name of the function in attribute `key` (a NameAttrList)."""
    if key not in node.nd.attr or not node.nd.attr[key].func.name:
        raise UnsupportedOpError(f"{node.op} has no function {key!r}")
    return node.nd.attr[key].func.name


def _signature(fn: Function) -> str:
    return ", ".join(str(v.type) for v in fn.outputs)


def _one_element(v: Value, what: str) -> None:
    if not v.type.is_static or v.type.numel != 1:
        raise UnsupportedOpError(f"{what} has type {v.type}: only a one-element predicate is supported")


@handles("If", "StatelessIf")
def _if(low, node):
    pred, args = low.get(node.inputs[0]), [low.get(k) for k in node.inputs[1:]]
    then_name, else_name = _func(node, "then_branch"), _func(node, "else_branch")
    _one_element(pred, "the predicate")
    known = const_array(pred)
    if known is not None:  # decided at capture time: the taken branch, inline
        fname = then_name if known.reshape(-1)[0] else else_name
        _, fg = _function_graph(low, fname, args)
        sub = low.sub(low.fn, fg)
        sub.b = low.b
        return sub.lower_function_graph(fg, args, low.b.loc)
    sink = [True] * len(args)
    then = _region(low, then_name, "then", args, sink)
    other = _region(low, else_name, "else", args, sink)
    if [(v.shape, v.dtype) for v in then.outputs] != [(v.shape, v.dtype) for v in other.outputs]:
        raise UnsupportedOpError(f"the branches return different types: then ({_signature(then)}), "
                                 f"else ({_signature(other)}); both must return the same shapes")
    if not then.outputs:
        return None
    passed = [v for v in args if not _constant(v)]
    return list(low.b.control("cuvil.if", [pred, *passed], [then, other], [v.type for v in then.outputs]))


def _passes_through(fg, i: int) -> bool:
    """Does the body return its input i unchanged (through Identity nodes)?"""
    t = fg.outputs[i]
    while t.op.type in ("Identity", "IdentityN") and t is not fg.inputs[i]:
        t = t.op.inputs[t.value_index if t.op.type == "IdentityN" else 0]
    return t is fg.inputs[i]


@handles("While", "StatelessWhile")
def _while(low, node):
    inputs = [low.get(k) for k in node.inputs]
    cond_name, body_name = _func(node, "cond"), _func(node, "body")
    fdef, fg = graph = _function_graph(low, body_name, inputs)
    if len(fg.outputs) != len(inputs):
        raise UnsupportedOpError(f"the loop body {body_name} returns {len(fg.outputs)} values for "
                                 f"{len(inputs)} loop variables")
    invariant = [_passes_through(fg, i) for i in range(len(inputs))]
    carried = [i for i, inv in enumerate(invariant) if not inv] or [0]
    rest = [i for i in range(len(inputs)) if i not in carried]
    order = carried + rest
    sink = [i in rest for i in range(len(inputs))]  # carried values change: never sunk
    body = _region(low, body_name, "body", inputs, sink, order, keep=carried, graph=graph)
    names = [a.name for a in fdef.signature.input_arg]
    for i, out in zip(carried, body.outputs):
        v = inputs[i]
        if (out.shape, out.dtype) != (v.shape, v.dtype):
            start = f"{node.inputs[i][0]}:{node.inputs[i][1]}"
            raise UnsupportedOpError(
                f"loop variable {names[i]!r} (input {i} of the loop, initially {start}) is {v.type} on entry "
                f"and {out.type} after the body: loop variables must keep their shape and dtype across iterations")
    cond = _region(low, cond_name, "cond", inputs, sink, order)
    if len(cond.outputs) != 1:
        raise UnsupportedOpError(f"the loop condition {cond_name} returns {len(cond.outputs)} values, not one")
    _one_element(cond.outputs[0], "the loop condition")
    operands = [inputs[i] for i in order if not (sink[i] and _constant(inputs[i]))]
    results = low.b.control("cuvil.while", operands, [cond, body], [inputs[i].type for i in carried],
                            carried=len(carried))
    outs: list = list(inputs)
    for i, r in zip(carried, results):
        outs[i] = r
    return outs
