"""Handlers lowering ONNX ops to Cuvil IR, registered by op type ('Conv') in the HANDLERS
table of onnx_common.py; the shape and data-movement ops are in onnx_shape_ops.py.

Each handler takes the Lowering state (which knows the model's opset) and the Node, and
returns a Value or a list with one entry per node output (None where an output is not
supported: using it is then an error). Operands that must be known at compile time
(shapes, axes, pads) are read with `static`.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from ..ir.types import FLOAT_DTYPES
from .graph import const_array, lower_einsum, produced_dim, same_pads
from .onnx_common import cuvil_dtype, handles, int_list, norm_axis, operand, scalar


def _fconst(low, value: float, like: Value) -> Value:
    return low.const(value, like.dtype)


# -- identity, constants, casts ----------------------------------------------------------------
@handles("Identity")
def _identity(low, node):
    return operand(low, node)


@handles("Dropout")
def _dropout(low, node):
    x = operand(low, node)
    ratio = scalar(low, node, 1, "the ratio")
    ratio = node.attr("ratio", 0.5) if ratio is None else ratio
    if scalar(low, node, 2, "training_mode") and ratio != 0:
        raise UnsupportedOpError("Dropout in training mode is random and is not supported")
    return [x, low.const(np.ones(x.shape, bool))]  # inference: every element kept


@handles("Constant")
def _constant(low, node):
    from onnx import numpy_helper
    for key, conv in (("value", lambda t: numpy_helper.to_array(t)), ("value_float", lambda v: np.float32(v)),
                      ("value_floats", lambda v: np.asarray(v, np.float32)), ("value_int", lambda v: np.int64(v)),
                      ("value_ints", lambda v: np.asarray(v, np.int64))):
        if key in node.attrs:
            return low.const(np.asarray(conv(node.attr(key))).copy(), name=low.node_name)
    raise UnsupportedOpError(f"Constant with {', '.join(node.attrs)} is not supported")


@handles("ConstantOfShape")
def _constant_of_shape(low, node):
    from onnx import numpy_helper
    shape = int_list(low, node, 0, "the shape")
    value = node.attr("value")
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    if any(isinstance(d, str) for d in shape):  # a symbolic shape: broadcast at run time
        return low.op("cuvil.broadcast_to", low.const(np.full([1] * len(shape), fill[0], dtype=fill.dtype)),
                      shape=shape)
    return low.const(np.full(shape, fill[0], dtype=fill.dtype))


@handles("Cast")
def _cast(low, node):
    return low.cast(operand(low, node), cuvil_dtype(node.attr("to")))


@handles("CastLike")
def _cast_like(low, node):
    return low.cast(operand(low, node), operand(low, node, 1).dtype)


@handles("Shape")
def _shape(low, node):
    x = operand(low, node)
    shape = list(x.shape)
    start, end = node.attr("start", 0), node.attr("end", len(shape))
    if x.type.is_static:
        return low.const(np.asarray(shape[slice(start, end)], np.int64))
    full = low.shape_of(x)  # symbolic dims: known now as SymDims, computed at run time too
    n = len(shape)
    lo, hi = slice(start, end).indices(n)[:2]
    if (lo, hi) == (0, n):
        return full
    return low.op("cuvil.slice", full, starts=[lo], ends=[max(hi, lo)], steps=[1])


@handles("Size")
def _size(low, node):
    x = operand(low, node)
    if not x.type.is_static:
        return low.op("cuvil.dim", dims=[x.type.numel_dim])
    return low.const(np.asarray(int(np.prod(x.shape, dtype=np.int64)), np.int64))


@handles("Range")
def _range(low, node):
    start, limit, delta = (low.static(operand(low, node, i), "the bounds of Range") for i in range(3))
    n = max(int(math.ceil((limit - start) / delta)), 0)
    return low.const((start + np.arange(n) * delta).astype(start.dtype))


# -- elementwise ----------------------------------------------------------------------------
def _unary(opname, **attrs):
    return lambda low, node: low.op(opname, operand(low, node), **attrs)


for _o, _c in [("Relu", "relu"), ("Sigmoid", "sigmoid"), ("Tanh", "tanh"), ("Sqrt", "sqrt"), ("Exp", "exp"),
               ("Log", "log"), ("Neg", "neg"), ("Abs", "abs"), ("Erf", "erf"), ("Reciprocal", "reciprocal"),
               ("HardSwish", "hardswish")]:
    handles(_o)(_unary(f"cuvil.{_c}"))


@handles("Elu")
def _elu(low, node):
    return low.op("cuvil.elu", operand(low, node), alpha=float(node.attr("alpha", 1.0)))


@handles("LeakyRelu")
def _leaky_relu(low, node):
    return low.op("cuvil.leaky_relu", operand(low, node), slope=float(node.attr("alpha", 0.01)))


@handles("Selu")
def _selu(low, node):
    x = operand(low, node)
    alpha, gamma = float(node.attr("alpha", 1.67326319217681884765625)), float(node.attr("gamma", 1.05070102214813232421875))
    return low.op("cuvil.mul", low.op("cuvil.elu", x, alpha=alpha), _fconst(low, gamma, x))


@handles("Celu")
def _celu(low, node):
    x = operand(low, node)
    alpha = float(node.attr("alpha", 1.0))
    scaled = low.op("cuvil.mul", x, _fconst(low, 1.0 / alpha, x))
    neg = low.op("cuvil.mul", low.op("cuvil.elu", scaled, alpha=1.0), _fconst(low, alpha, x))
    return low.op("cuvil.where", low.op("cuvil.gt", x, _fconst(low, 0.0, x)), x, neg)


@handles("HardSigmoid")
def _hard_sigmoid(low, node):
    x = operand(low, node)
    alpha, beta = float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
    y = low.op("cuvil.add", low.op("cuvil.mul", x, _fconst(low, alpha, x)), _fconst(low, beta, x))
    return low.op("cuvil.clamp", y, min=0.0, max=1.0)


@handles("ThresholdedRelu")
def _thresholded_relu(low, node):
    x = operand(low, node)
    keep = low.op("cuvil.gt", x, _fconst(low, float(node.attr("alpha", 1.0)), x))
    return low.op("cuvil.where", keep, x, _fconst(low, 0.0, x))


def _softplus(low, x):
    soft = low.op("cuvil.log", low.op("cuvil.add", low.op("cuvil.exp", x), _fconst(low, 1.0, x)))
    return low.op("cuvil.where", low.op("cuvil.gt", x, _fconst(low, 20.0, x)), x, soft)


@handles("Softplus")
def _softplus_h(low, node):
    return _softplus(low, operand(low, node))


@handles("Softsign")
def _softsign(low, node):
    x = operand(low, node)
    return low.op("cuvil.div", x, low.op("cuvil.add", low.op("cuvil.abs", x), _fconst(low, 1.0, x)))


@handles("Mish")
def _mish(low, node):
    x = operand(low, node)
    return low.op("cuvil.mul", x, low.op("cuvil.tanh", _softplus(low, x)))


@handles("Gelu")
def _gelu(low, node):
    return low.op("cuvil.gelu", operand(low, node), approximate=node.attr("approximate", "none"))


@handles("Sign")
def _sign(low, node):
    x = operand(low, node)
    zero, one = low.const(0, x.dtype), low.const(1, x.dtype)
    neg = low.const(-1, x.dtype) if x.dtype not in ("u8",) else zero
    return low.op("cuvil.where", low.op("cuvil.gt", x, zero), one,
                  low.op("cuvil.where", low.op("cuvil.lt", x, zero), neg, zero))


@handles("PRelu")
def _prelu(low, node):
    x, slope = operand(low, node), operand(low, node, 1)
    return low.op("cuvil.where", low.op("cuvil.gt", x, low.const(0, x.dtype)), x, low.op("cuvil.mul", x, slope))


@handles("Clip")
def _clip(low, node):
    x = operand(low, node)
    if low.opset < 11:
        lo, hi = node.attr("min"), node.attr("max")
    else:
        lo, hi = operand(low, node, 1), operand(low, node, 2)
        if any(v is not None and const_array(v) is None for v in (lo, hi)):  # computed bounds
            y = x if lo is None else low.op("cuvil.maximum", x, lo)
            return y if hi is None else low.op("cuvil.minimum", y, hi)
        lo, hi = (None if v is None else np.ravel(const_array(v))[0] for v in (lo, hi))
    cast = float if x.dtype in FLOAT_DTYPES else int
    if lo is None and hi is None:
        return x
    return low.op("cuvil.clamp", x, min=None if lo is None else cast(lo), max=None if hi is None else cast(hi))


def _binary(opname):
    return lambda low, node: low.op(opname, operand(low, node, 0), operand(low, node, 1))


for _o, _c in [("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("Equal", "eq"), ("Less", "lt"),
               ("Greater", "gt"), ("LessOrEqual", "le"), ("GreaterOrEqual", "ge"), ("And", "and"), ("Or", "or"),
               ("Xor", "ne")]:
    handles(_o)(_binary(f"cuvil.{_c}"))


@handles("Div")
def _div(low, node):
    a, b = operand(low, node, 0), operand(low, node, 1)
    if a.dtype in FLOAT_DTYPES:
        return low.op("cuvil.div", a, b)
    # ONNX integer division truncates toward zero; cuvil.div on integers floors.
    q = low.op("cuvil.div", a, b)
    if a.dtype == "u8":
        return q
    rem = low.op("cuvil.sub", a, low.op("cuvil.mul", q, b))
    fix = low.op("cuvil.and", low.op("cuvil.ne", rem, low.const(0, a.dtype)),
                 low.op("cuvil.ne", low.op("cuvil.lt", a, low.const(0, a.dtype)),
                        low.op("cuvil.lt", b, low.const(0, a.dtype))))
    return low.op("cuvil.where", fix, low.op("cuvil.add", q, low.const(1, a.dtype)), q)


@handles("Pow")
def _pow(low, node):
    a, b = operand(low, node, 0), operand(low, node, 1)
    return low.op("cuvil.pow", a, low.cast(b, a.dtype))


@handles("Not")
def _not(low, node):
    return low.op("cuvil.eq", operand(low, node), low.const(False, "bool"))


@handles("Where")
def _where(low, node):
    return low.op("cuvil.where", *(operand(low, node, i) for i in range(3)))


def _variadic(opname, mean=False):
    def handler(low, node):
        vals = [low.get(n) for n in node.inputs if n]
        y = vals[0]
        for v in vals[1:]:
            y = low.op(opname, y, v)
        if len(vals) == 1 and mean is False:
            return y
        if mean:
            y = low.op("cuvil.div", y, low.const(float(len(vals)), y.dtype))
        return y
    return handler


handles("Sum")(_variadic("cuvil.add"))
handles("Mean")(_variadic("cuvil.add", mean=True))
handles("Max")(_variadic("cuvil.maximum"))
handles("Min")(_variadic("cuvil.minimum"))


# -- matrix products --------------------------------------------------------------------------
@handles("MatMul")
def _matmul(low, node):
    return low.matmul(operand(low, node, 0), operand(low, node, 1))


@handles("Gemm")
def _gemm(low, node):
    a, b, c = operand(low, node, 0), operand(low, node, 1), operand(low, node, 2)
    if node.attr("transA", 0):
        a = low.transpose(a, [1, 0])
    if node.attr("transB", 0):
        b = low.transpose(b, [1, 0])
    y = low.op("cuvil.matmul", a, b)
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = low.op("cuvil.mul", y, _fconst(low, alpha, y))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = low.op("cuvil.mul", c, _fconst(low, beta, c))
        y = low.op("cuvil.add", y, c)
    return y


@handles("Einsum")
def _einsum(low, node):
    return lower_einsum(low, node.attr("equation"), [low.get(n) for n in node.inputs])


# -- convolution, normalisation, pooling -------------------------------------------------------
def _as_2d(low, x: Value):
    """(x with a unit H for 1-D spatial data, whether it was 1-D)."""
    if x.type.rank == 3:
        return low.reshape(x, [x.shape[0], x.shape[1], 1, x.shape[2]]), True
    if x.type.rank != 4:
        raise UnsupportedOpError(f"only 1-D and 2-D spatial data is supported, got {x.type}")
    return x, False


def _geometry(node, x: Value, kernel, one_d: bool):
    """(strides, dilations, pads [t, l, b, r]) from the ONNX attributes."""
    lift = (lambda v, d: [d, *v]) if one_d else (lambda v, d: list(v))
    strides = lift(node.attr("strides") or [1] * (1 if one_d else 2), 1)
    dil = lift(node.attr("dilations") or [1] * (1 if one_d else 2), 1)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pairs = [same_pads(x.shape[2 + i], kernel[i], strides[i], dil[i]) for i in range(2)]
        if auto == "SAME_LOWER":
            pairs = [(hi, lo) for lo, hi in pairs]
        return strides, dil, [pairs[0][0], pairs[1][0], pairs[0][1], pairs[1][1]]
    if auto == "VALID":
        return strides, dil, [0, 0, 0, 0]
    p = node.attr("pads") or [0] * (2 if one_d else 4)
    pads = [0, p[0], 0, p[1]] if one_d else [p[0], p[1], p[2], p[3]]
    return strides, dil, pads


@handles("Conv")
def _conv(low, node):
    x, w, b = operand(low, node, 0), operand(low, node, 1), operand(low, node, 2)
    x, one_d = _as_2d(low, x)
    if one_d:
        w = low.reshape(w, [w.shape[0], w.shape[1], 1, w.shape[2]])
    strides, dil, pads = _geometry(node, x, w.shape[2:], one_d)
    y = low.op("cuvil.conv2d", x, w, stride=strides, dilation=dil, pads=pads, groups=int(node.attr("group", 1)))
    if b is not None:
        y = low.op("cuvil.add", y, low.reshape(b, [1, b.shape[0], 1, 1]))
    return low.reshape(y, [y.shape[0], y.shape[1], y.shape[3]]) if one_d else y


def _pool(low, node, kind):
    x, one_d = _as_2d(low, operand(low, node))
    k = node.attr("kernel_shape")
    kernel = [1, *k] if one_d else list(k)
    strides, dil, pads = _geometry(node, x, kernel, one_d)
    ceil = bool(node.attr("ceil_mode", 0))
    if kind == "max":
        if node.attr("storage_order", 0):
            raise UnsupportedOpError("MaxPool storage_order=1 is not supported")
        y = low.op("cuvil.max_pool2d", x, kernel=kernel, stride=strides, pads=pads, dilation=dil, ceil_mode=ceil)
    else:
        if dil != [1, 1]:
            raise UnsupportedOpError("AveragePool with dilations is not supported")
        y = low.op("cuvil.avg_pool2d", x, kernel=kernel, stride=strides, pads=pads, ceil_mode=ceil,
                   count_include_pad=bool(node.attr("count_include_pad", 0)), divisor=0)
    y = low.reshape(y, [y.shape[0], y.shape[1], y.shape[3]]) if one_d else y
    return [y, None]


handles("MaxPool")(lambda low, node: _pool(low, node, "max"))
handles("AveragePool")(lambda low, node: _pool(low, node, "avg"))


@handles("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(low, node):
    x = operand(low, node)
    op = "cuvil.reduce_mean" if node.op == "GlobalAveragePool" else "cuvil.reduce_max"
    return low.op(op, x, axes=list(range(2, x.type.rank)), keepdims=True)


@handles("BatchNormalization")
def _batch_norm(low, node):
    if node.attr("training_mode", 0):
        raise UnsupportedOpError("BatchNormalization in training mode is not supported")
    x, scale, bias, mean, var = (operand(low, node, i) for i in range(5))
    y = low.op("cuvil.batch_norm", x, mean, var, scale, bias, eps=float(node.attr("epsilon", 1e-5)))
    return [y, None, None]


def _affine_operand(low, v: Value | None, shape) -> Value | None:
    if v is None or tuple(v.shape) == tuple(shape):
        return v
    return low.broadcast(v, shape)


@handles("LayerNormalization")
def _layer_norm(low, node):
    x, scale, bias = operand(low, node, 0), operand(low, node, 1), operand(low, node, 2)
    axis = norm_axis(node.attr("axis", -1), x.type.rank)
    shape = x.shape[axis:]
    params = [p for p in (_affine_operand(low, scale, shape), _affine_operand(low, bias, shape)) if p is not None]
    eps = float(node.attr("epsilon", 1e-5))
    y = low.op("cuvil.layer_norm", x, *params, num_axes=x.type.rank - axis, eps=eps)
    if not any(node.outputs[1:]):
        return [y]
    axes = list(range(axis, x.type.rank))  # the statistics outputs, as plain ops
    mean = low.op("cuvil.reduce_mean", x, axes=axes, keepdims=True)
    d = low.op("cuvil.sub", x, mean)
    var = low.op("cuvil.reduce_mean", low.op("cuvil.mul", d, d), axes=axes, keepdims=True)
    return [y, mean, low.op("cuvil.rsqrt", low.op("cuvil.add", var, _fconst(low, eps, var)))]


def _normalize_groups(low, x: Value, groups: int, eps: float) -> Value:
    n, c = x.shape[0], x.shape[1]
    y = low.reshape(x, [n, groups, (c // groups) * int(np.prod(x.shape[2:], dtype=np.int64))])
    return low.reshape(low.op("cuvil.layer_norm", y, num_axes=1, eps=eps), list(x.shape))


def _channel_affine(low, y: Value, scale: Value, bias: Value) -> Value:
    shape = [1, y.shape[1]] + [1] * (y.type.rank - 2)
    y = low.op("cuvil.mul", y, low.reshape(scale, shape))
    return low.op("cuvil.add", y, low.reshape(bias, shape))


@handles("InstanceNormalization")
def _instance_norm(low, node):
    x = operand(low, node)
    y = _normalize_groups(low, x, x.shape[1], float(node.attr("epsilon", 1e-5)))
    return _channel_affine(low, y, operand(low, node, 1), operand(low, node, 2))


@handles("GroupNormalization")
def _group_norm(low, node):
    x, scale, bias = (operand(low, node, i) for i in range(3))
    g, c = int(node.attr("num_groups")), x.shape[1]
    y = _normalize_groups(low, x, g, float(node.attr("epsilon", 1e-5)))
    if scale.shape[0] == g and g != c:  # opset 18: one scale per group
        scale, bias = (low.reshape(low.broadcast(low.reshape(v, [g, 1]), [g, c // g]), [c]) for v in (scale, bias))
    return _channel_affine(low, y, scale, bias)


# -- reductions and softmax ----------------------------------------------------------------------
def _reduce_axes(low, node, x: Value):
    """Sorted axes, or None for 'no reduction' (noop_with_empty_axes)."""
    since = 13 if node.op == "ReduceSum" else 18
    axes = int_list(low, node, 1, "the axes") if low.opset >= since else node.attr("axes")
    if not axes:
        return None if node.attr("noop_with_empty_axes", 0) else list(range(x.type.rank))
    return sorted({norm_axis(a, x.type.rank) for a in axes})


def _reduce(kind):
    def handler(low, node):
        x = operand(low, node)
        axes = _reduce_axes(low, node, x)
        if axes is None:
            return x
        keep = bool(node.attr("keepdims", 1))
        red = lambda op, v: low.op(op, v, axes=axes, keepdims=keep)  # noqa: E731
        if kind in ("mean", "sum", "max", "min"):
            return red(f"cuvil.reduce_{kind}", x)
        if kind == "l1":
            return red("cuvil.reduce_sum", low.op("cuvil.abs", x))
        if kind in ("l2", "sumsquare"):
            s = red("cuvil.reduce_sum", low.op("cuvil.mul", x, x))
            return low.op("cuvil.sqrt", s) if kind == "l2" else s
        if kind == "logsum":
            return low.op("cuvil.log", red("cuvil.reduce_sum", x))
        m = low.op("cuvil.reduce_max", x, axes=axes, keepdims=True)  # logsumexp
        s = low.op("cuvil.reduce_sum", low.op("cuvil.exp", low.op("cuvil.sub", x, m)), axes=axes, keepdims=keep)
        return low.op("cuvil.add", low.op("cuvil.log", s), low.reshape(m, s.shape))
    return handler


for _o, _k in [("ReduceMean", "mean"), ("ReduceSum", "sum"), ("ReduceMax", "max"), ("ReduceMin", "min"),
               ("ReduceL1", "l1"), ("ReduceL2", "l2"), ("ReduceSumSquare", "sumsquare"),
               ("ReduceLogSum", "logsum"), ("ReduceLogSumExp", "logsumexp")]:
    handles(_o)(_reduce(_k))


def _softmax(opname):
    def handler(low, node):
        x = operand(low, node)
        if low.opset >= 13:
            return low.op(opname, x, axis=norm_axis(node.attr("axis", -1), x.type.rank))
        axis = norm_axis(node.attr("axis", 1), x.type.rank)  # older opsets: over the flattened tail
        outer = int(np.prod(x.shape[:axis], dtype=np.int64))
        y = low.op(opname, low.reshape(x, [outer, x.type.numel // max(outer, 1)]), axis=1)
        return low.reshape(y, x.shape)
    return handler


handles("Softmax")(_softmax("cuvil.softmax"))
handles("LogSoftmax")(_softmax("cuvil.log_softmax"))



# -- data-dependent sizes (ir/ops/dynamic.py) ---------------------------------------------------
def _count(x: Value, op: str) -> int:
    if not x.type.is_static:
        raise UnsupportedOpError(f"{op} of a tensor with symbolic dims ({x.type}) is not supported")
    return int(np.prod(x.shape, dtype=np.int64)) if x.type.rank else 1


@handles("NonZero")
def _nonzero(low, node):
    """[rank, count]: the transpose of cuvil.nonzero's rows."""
    x = operand(low, node)
    idx = low.op("cuvil.nonzero", low.cast(x, "bool"), size=produced_dim(low, "nonzero", _count(x, "NonZero")))
    return low.transpose(idx, [1, 0])


@handles("Unique")
def _unique(low, node):
    """Sorted distinct values of the flattened input, the index of each one's first
    occurrence, each element's index among them, and their counts."""
    x = operand(low, node)
    if node.attr("axis") is not None:
        raise UnsupportedOpError("Unique along an axis is not supported (the flattened form is)")
    flat = low.reshape(x, [_count(x, "Unique")])
    values = low.op("cuvil.unique", flat, size=produced_dim(low, "unique", _count(x, "Unique")))
    u = values.shape[0]
    same = low.op("cuvil.eq", low.reshape(values, [u, 1]), low.reshape(flat, [1, flat.shape[0]]))
    first = low.op("cuvil.argmax", same, axis=1, keepdims=False)
    outs = [values, first, low.op("cuvil.unique_inverse", flat, values), low.op("cuvil.unique_counts", flat, values)]
    if node.attr("sorted", 1):
        return outs
    # sorted=0: in order of first occurrence. rank[i] = how many values occur before value
    # i; perm[j] = the i of rank j (an argmax over rank == j, j = 0..u-1 being the values'
    # own positions among themselves); every output is gathered through it.
    earlier = low.op("cuvil.lt", low.reshape(first, [1, u]), low.reshape(first, [u, 1]))
    rank = low.op("cuvil.reduce_sum", low.cast(earlier, "i64"), axes=[1], keepdims=False)
    j = low.op("cuvil.unique_inverse", values, values)
    perm = low.op("cuvil.argmax", low.op("cuvil.eq", low.reshape(rank, [1, u]), low.reshape(j, [u, 1])), axis=1,
                  keepdims=False)
    values, first, inverse, counts = outs
    return [low.op("cuvil.gather", values, perm, axis=0), low.op("cuvil.gather", first, perm, axis=0),
            low.op("cuvil.gather", rank, inverse, axis=0), low.op("cuvil.gather", counts, perm, axis=0)]
