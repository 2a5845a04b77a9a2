"""What the graph frontends (TensorFlow GraphDef, ONNX) share: a lowering state that
builds one Cuvil function from a graph of named tensors.

Such graphs compute shapes at run time (`Shape` -> `StridedSlice` -> `Pack` ->
`Reshape`); with static input shapes all of that is constant, so `op()` evaluates an op
whose operands are all constants right away (with the ops' NumPy references) and emits a
constant instead. Handlers then read attribute-like operands with `static()`.
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import FrontendError, UnsupportedOpError
from ..ir import OP_REGISTRY, Builder, Function, Module, Value, verify
from ..ir import symdim
from ..ir.interpreter import evaluate_op
from ..ir.ops.shape import Constant
from ..ir.types import DTYPES

# Fold an op on constants unless its result is both over this size and much larger than
# its inputs (a scalar broadcast to a feature map is cheaper to compute than to store).
_FOLD_MAX_BYTES = 1 << 20
_FOLD_MAX_GROWTH = 4.0


def registrar(table: dict, key=lambda name: name):
    """A decorator maker for a frontend's handler table: `@handles("Conv", ...)` files the
    function under each name (through `key`)."""
    def handles(*names):
        def deco(fn):
            for n in names:
                table[key(n)] = fn
            return fn
        return deco
    return handles


def const_array(v: Value) -> np.ndarray | None:
    op = v.defining_op
    return op.value if op is not None and op.name == "cuvil.constant" else None


# Ops that shape tensors go through (their references handle object arrays of SymDims).
_SHAPE_ARITH = frozenset({"cuvil.gather", "cuvil.concat", "cuvil.reshape", "cuvil.slice", "cuvil.cast",
                          "cuvil.add", "cuvil.sub", "cuvil.mul", "cuvil.div", "cuvil.broadcast_to",
                          "cuvil.transpose"})


class SymDim:
    """A symbolic dim inside a shape tensor that the frontend evaluates at capture time
    (ONNX/TF `Shape` -> Gather -> Concat -> Reshape chains): NumPy object arrays of these
    and ints go through the ops' references, and arithmetic follows symdim's rules."""

    __slots__ = ("dim",)

    def __init__(self, dim):
        self.dim = dim

    @staticmethod
    def wrap(d):
        return SymDim(d) if isinstance(d, str) else d

    @staticmethod
    def unwrap(d):
        return d.dim if isinstance(d, SymDim) else int(d)

    def _other(self, o):
        if isinstance(o, SymDim):
            return o.dim
        if isinstance(o, (int, np.integer)):
            return int(o)
        raise UnsupportedOpError(f"symbolic size {self.dim} combined with {o!r}")

    def __add__(self, o):
        return SymDim.wrap(symdim.add(self.dim, self._other(o)))

    __radd__ = __add__

    def __sub__(self, o):
        return SymDim.wrap(symdim.sub(self.dim, self._other(o)))

    def __rsub__(self, o):
        return SymDim.wrap(symdim.sub(self._other(o), self.dim))

    def __mul__(self, o):
        return SymDim.wrap(symdim.mul(self.dim, self._other(o)))

    __rmul__ = __mul__

    def __floordiv__(self, o):
        q = symdim.exact_div(self.dim, self._other(o))
        if q is None:
            raise UnsupportedOpError(f"symbolic size {self.dim} divided by {o!r} is not exact")
        return SymDim.wrap(q)

    def _cmp(self, o):
        raise UnsupportedOpError(f"the symbolic size {self.dim} is compared at capture time")

    __lt__ = __le__ = __gt__ = __ge__ = _cmp

    def __eq__(self, o):
        return isinstance(o, SymDim) and o.dim == self.dim

    def __hash__(self):
        return hash(self.dim)

    def __repr__(self):
        return str(self.dim)


class GraphLowering:
    """State while lowering one graph: the function being built, unique constant names,
    and the node being lowered (`where`, for error messages)."""

    def __init__(self, fn: Function):
        self.fn = fn
        self.b = Builder(fn.body)
        self.where = ""         # e.g. "node 'dense/MatMul' (MatMul)"
        self.node_name = ""     # base name for constants folded while lowering this node
        self._names: set[str] = set()
        self.symbolic: dict[int, np.ndarray] = {}  # value id -> its known value with SymDims

    # -- constants ------------------------------------------------------------------------
    def fresh_name(self, base: str) -> str:
        base = re.sub(r"\s+", "_", base) or "const"
        name, n = base, 0
        while name in self._names:
            n += 1
            name = f"{base}.{n}"
        self._names.add(name)
        return name

    def const(self, value, dtype: str | None = None, name: str = "") -> Value:
        arr = np.asarray(value, dtype=DTYPES[dtype] if dtype else None)
        if dtype is None and arr.dtype == np.float64 and not isinstance(value, np.ndarray):
            arr = arr.astype(np.float32)  # Python floats are f32 constants unless asked
        if arr.dtype == np.dtype("O") or arr.dtype not in DTYPES.values():
            raise UnsupportedOpError(f"constant of dtype {arr.dtype} is not supported")
        return self.b.constant(arr, self.fresh_name(name or self.node_name or "const"))

    def static(self, v: Value, what: str) -> np.ndarray:
        """The array of a constant operand (shapes, axes, paddings): must be known now. A
        shape computed from symbolic dims is an object array holding SymDims."""
        arr = const_array(v)
        if arr is None:
            arr = self.symbolic.get(id(v))
        if arr is None:
            raise UnsupportedOpError(f"{what} must be a constant (it is computed at run time here)")
        return arr

    # -- ops ----------------------------------------------------------------------------
    def op(self, name: str, *operands: Value, **attrs) -> Value:
        return self.op_multi(name, *operands, **attrs)[0]

    def shape_of(self, v: Value) -> Value:
        """The shape of v as a 1-D i64 tensor: a constant, or (symbolic dims) a tensor whose
        value is known at capture time as SymDims (and computed at run time too)."""
        shape = list(v.shape)
        if all(isinstance(d, int) for d in shape):
            return self.const(np.asarray(shape, np.int64))
        parts = [self.const(np.asarray([d], np.int64)) if isinstance(d, int) else
                 self.op("cuvil.reshape", self.op("cuvil.dim", dims=[d]), shape=[1]) for d in shape]
        out = parts[0] if len(parts) == 1 else self.op("cuvil.concat", *parts, axis=0)
        self.symbolic[id(out)] = np.asarray([SymDim.wrap(d) for d in shape], dtype=object)
        return out

    def _symbolic_fold(self, op, operands) -> list[Value] | None:
        """An op on shape tensors with SymDims: its value at capture time (the op itself
        stays, for run time, unless the value came out static)."""
        if op.name not in _SHAPE_ARITH or op.results[0].dtype not in ("i64", "i32"):
            return None
        args = [self.symbolic.get(id(v), const_array(v)) for v in operands]
        if any(a is None for a in args):
            return None
        attrs = {k: v for k, v in op.attrs.items()}
        if op.name == "cuvil.cast":
            outs = [args[0]]
        else:
            try:
                outs = type(op).reference(args, attrs)
            except (UnsupportedOpError, TypeError, ValueError, IndexError):
                return None
        out = np.asarray(outs[0], dtype=object)
        if not any(isinstance(x, SymDim) for x in out.ravel()):
            return [self.const(out.astype(op.results[0].type.np_dtype))]
        r = self.b.insert(op).results
        self.symbolic[id(r[0])] = out
        return r

    def op_multi(self, name: str, *operands: Value, **attrs) -> list[Value]:
        op = OP_REGISTRY[name](list(operands), attrs, None, self.b.loc)
        if self.symbolic and any(id(v) in self.symbolic for v in operands):
            folded = self._symbolic_fold(op, operands)
            if folded is not None:
                return folded
        args = [const_array(v) for v in operands]
        if operands and all(a is not None for a in args) and self._foldable(op, args):
            try:
                with np.errstate(all="ignore"):
                    outs = evaluate_op(op, args)
            except (ArithmeticError, ValueError, IndexError):
                outs = None
            if outs is not None:
                op.drop_operands()
                return [self.b.insert(Constant(o, self.fresh_name(self.node_name or "fold"), self.b.loc)).result
                        for o in outs]
        return self.b.insert(op).results

    @staticmethod
    def _foldable(op, args) -> bool:
        if not all(r.type.is_static for r in op.results):
            return False
        out = sum(r.type.nbytes for r in op.results)
        return out <= _FOLD_MAX_BYTES or out <= _FOLD_MAX_GROWTH * sum(a.nbytes for a in args)

    # -- helpers the handlers share -------------------------------------------------------------
    def cast(self, v: Value, dtype: str) -> Value:
        return v if v.dtype == dtype else self.op("cuvil.cast", v, dtype=dtype)

    def reshape(self, v: Value, shape) -> Value:
        shape = [d if isinstance(d, str) else int(d) for d in shape]
        return v if list(v.shape) == shape else self.op("cuvil.reshape", v, shape=shape)

    def transpose(self, v: Value, perm) -> Value:
        perm = [int(p) for p in perm]
        return v if perm == sorted(perm) else self.op("cuvil.transpose", v, perm=perm)

    def broadcast(self, v: Value, shape) -> Value:
        shape = [d if isinstance(d, str) else int(d) for d in shape]
        if list(v.shape) == shape:
            return v
        if v.type.rank < len(shape):
            v = self.reshape(v, [1] * (len(shape) - v.type.rank) + list(v.shape))
        return self.op("cuvil.broadcast_to", v, shape=shape)

    def slice(self, v: Value, dim: int, start: int, end: int, step: int = 1) -> Value:
        return slice_dim(self, v, dim, start, end, step)

    def concat(self, values: list[Value], axis: int) -> Value:
        values = [v for v in values if v.shape[axis] != 0] or values[:1]
        return values[0] if len(values) == 1 else self.op("cuvil.concat", *values, axis=axis)

    def matmul(self, a: Value, b: Value) -> Value:
        """NumPy matmul semantics, 1-D operands included."""
        a2 = a if a.type.rank >= 2 else self.reshape(a, [1, a.shape[0]])
        b2 = b if b.type.rank >= 2 else self.reshape(b, [b.shape[0], 1])
        y = self.op("cuvil.matmul", a2, b2)
        shape = list(y.shape)
        if a.type.rank == 1:
            shape.pop(-2)
        if b.type.rank == 1:
            shape.pop(-1)
        return self.reshape(y, shape)

    def finish(self, outputs: list[Value], names: list[str]) -> Module:
        """Return `outputs`, drop what they do not need, verify."""
        from ..passes.dce import DeadCodeElimination
        for i, v in enumerate(outputs):
            if not isinstance(v, Value):
                raise FrontendError(f"model output {names[i]!r} is not a tensor")
        self.b.loc = ""
        self.b.op_multi("cuvil.return", *outputs)
        self.fn.output_names = list(names)
        module = Module()
        module.add(self.fn)
        DeadCodeElimination().apply(module)
        verify(module)
        return module


def _slice_op(low, v: Value, dim: int, start, end, step) -> Value:
    starts, ends, steps = [0] * v.type.rank, list(v.shape), [1] * v.type.rank
    starts[dim], ends[dim], steps[dim] = start, end, step
    return low.op("cuvil.slice", v, starts=starts, ends=ends, steps=steps)


def slice_dim(low, v: Value, dim: int, start: int, end: int, step: int = 1) -> Value:
    """v[start:end:step] along a static dim (Python's rules for the bounds); v itself
    where that is all of it. `low` is any frontend's lowering (its `op`)."""
    n = v.shape[dim]
    start, end, step = slice(start, end, step).indices(n)
    end = max(end, start)
    if (start, end, step) == (0, n, 1):
        return v
    return _slice_op(low, v, dim, start, end, step)


def symbolic_slice(low, v: Value, dim: int, start, end, step, what: str) -> Value:
    """A slice where the dim or the end is symbolic: a constant start >= 0 and step 1; an
    end past the dim (None, a huge int such as INT64_MAX, the dim itself) is the dim.
    `what` names the framework's op in the error."""
    n = v.shape[dim]
    start, step = start or 0, step or 1
    if end is None or end == n or (isinstance(end, int) and isinstance(n, str) and end >= 2**31):
        end = n
    if not isinstance(start, (int, np.integer)) or start < 0 or step != 1 or (isinstance(end, int) and end < 0):
        raise UnsupportedOpError(f"{what} {start}:{end}:{step} of the symbolic dim {n} is not supported "
                                 "(a constant start >= 0, step 1 and the dim or a symbolic end are)")
    if (start, end) == (0, n):
        return v
    return _slice_op(low, v, dim, start, end, 1)


def produced_dim(low, kind: str, bound: int, taken=()) -> str:
    """A fresh produced dim `kind`, `kind1`, ... (bounds [0, bound] in the function's
    dim_bounds) for a data-dependent size (ir/ops/dynamic.py); `taken`: other names in use."""
    bounds = low.fn.attrs.setdefault("dim_bounds", {})
    taken = set(bounds) | set(taken)
    name, n = kind, 0
    while name in taken:
        n += 1
        name = f"{kind}{n}"
    bounds[name] = [0, int(bound)]
    return name


def write_row(low, buf: Value, row: Value, i: Value) -> Value:
    """buf with row i (a 0-d i64 value) replaced by `row`: how a loop body writes one
    step's slice of a scan output it carries (a `where` over the rows)."""
    n = buf.shape[0]
    slots = low.const(np.arange(n, dtype=np.int64).reshape([n] + [1] * row.type.rank))
    here = low.op("cuvil.eq", slots, i)
    return low.op("cuvil.where", here, low.reshape(row, [1, *row.shape]), buf)


def check_type(v: Value, shape, dtype: str | None, what: str) -> None:
    """Compare a lowered value with the framework's static type (None dims: unknown)."""
    if shape is not None and (len(shape) != v.type.rank or any(
            d is not None and d != e for d, e in zip(shape, v.shape))):
        raise FrontendError(f"internal: {what} lowered to {v.type}, the framework says shape "
                            f"{[d if d is not None else '?' for d in shape]}")
    if dtype is not None and dtype != v.dtype:
        raise FrontendError(f"internal: {what} lowered to {v.type}, the framework says dtype {dtype}")


# -- shared shape arithmetic --------------------------------------------------------------------
def same_pads(size: int, k: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow/ONNX SAME_UPPER padding: output ceil(size / stride), extra pad at the end."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def einsum_plan(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Split an einsum equation into operand subscripts and the output subscript (implicit
    output: the letters used once, sorted). Ellipses are not supported."""
    eq = equation.replace(" ", "")
    if "." in eq:
        raise UnsupportedOpError(f"einsum with an ellipsis ({equation!r}) is not supported")
    lhs, _, out = eq.partition("->")
    ins = lhs.split(",")
    if "->" not in eq:
        letters = "".join(ins)
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if len(ins) != len(ranks) or any(len(s) != r for s, r in zip(ins, ranks)):
        raise UnsupportedOpError(f"einsum {equation!r} does not match operand ranks {ranks}")
    if any(len(set(s)) != len(s) for s in ins):
        raise UnsupportedOpError(f"einsum {equation!r} with a repeated index in one operand (a trace/diagonal)")
    return ins, out


def lower_einsum(low: GraphLowering, equation: str, operands: list[Value]) -> Value:
    """One or two operands: reduce letters only one operand has (and the output lacks),
    then one batched matmul [batch, M, K] x [batch, K, N] and a transpose to the output."""
    ins, out = einsum_plan(equation, [v.type.rank for v in operands])
    vals, subs = list(operands), list(ins)
    for i, (v, s) in enumerate(zip(vals, subs)):  # sum out letters nothing else uses
        others = out + "".join(t for j, t in enumerate(subs) if j != i)
        gone = [k for k, c in enumerate(s) if c not in others]
        if gone:
            vals[i] = low.op("cuvil.reduce_sum", v, axes=gone, keepdims=False)
            subs[i] = "".join(c for c in s if c in others)
    size = {c: d for v, s in zip(vals, subs) for c, d in zip(s, v.shape) if d != 1}
    for v, s in zip(vals, subs):
        for c, d in zip(s, v.shape):
            size.setdefault(c, d)
    if len(vals) == 1:
        v, s = vals[0], subs[0]
        return low.transpose(v, [s.index(c) for c in out])
    if len(vals) != 2:
        raise UnsupportedOpError(f"einsum with {len(vals)} operands is not supported (1 or 2)")
    (a, sa), (b, sb) = zip(vals, subs)
    batch = [c for c in sa if c in sb and c in out]
    contract = [c for c in sa if c in sb and c not in out]
    fa = [c for c in sa if c not in sb]
    fb = [c for c in sb if c not in sa]

    def arrange(v, s, order):
        v = low.transpose(v, [s.index(c) for c in order])
        full = [size[c] for c in order]
        return low.broadcast(v, full) if list(v.shape) != full else v

    n = lambda cs: int(np.prod([size[c] for c in cs], dtype=np.int64))  # noqa: E731
    bd = [size[c] for c in batch]
    a3 = low.reshape(arrange(a, sa, batch + fa + contract), [*bd, n(fa), n(contract)])
    b3 = low.reshape(arrange(b, sb, batch + contract + fb), [*bd, n(contract), n(fb)])
    y = low.op("cuvil.matmul", a3, b3)
    got = batch + fa + fb
    y = low.reshape(y, [size[c] for c in got])
    return low.transpose(y, [got.index(c) for c in out])
