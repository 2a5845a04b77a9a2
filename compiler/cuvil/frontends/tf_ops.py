"""Handlers lowering TensorFlow GraphDef ops to Cuvil IR, registered by op type ('Conv2D')
in the HANDLERS table of tf_common.py; the shape and data-movement ops are in
tf_shape_ops.py.

Each handler takes the Lowering state and the Node and returns the node's outputs: a
Value, an `NCHW(value)` (a 4-D output held in NCHW form), None for an output nothing may
use, or a list of those. Operands that TensorFlow passes as tensors but that must be
known at compile time (shapes, axes, paddings) are read with `static`.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from .graph import const_array, lower_einsum, same_pads
from .tf_common import NCHW, NHWC_TO_NCHW, TF_DTYPES, cuvil_dtype, handles, norm_axis, operand, static_operand


# -- identity-like and constants ---------------------------------------------------------------
@handles("Identity", "StopGradient", "Snapshot", "PreventGradient", "EnsureShape", "CheckNumerics")
def _identity(low, node):
    key = node.inputs[0]
    return NCHW(low.nchw(key)) if low.has_nchw(key) and key not in low.env else low.get(key)


@handles("IdentityN")
def _identity_n(low, node):
    return [low.get(k) for k in node.inputs]


@handles("NoOp")
def _noop(low, node):
    return None


@handles("Const")
def _const(low, node):
    value = node.attr("value")
    if value.dtype.name not in TF_DTYPES:
        raise UnsupportedOpError(f"constant of dtype {value.dtype} is not supported")
    return low.const(value, name=low.node_name)


@handles("Placeholder")
def _placeholder(low, node):
    raise UnsupportedOpError("a placeholder that is not an input of the function")


# -- elementwise ----------------------------------------------------------------------------
def _unary(fn):
    def handler(low, node):
        key = node.inputs[0]
        if low.has_nchw(key):
            return NCHW(fn(low, low.nchw(key), node))
        return fn(low, low.get(key), node)
    return handler


def _simple(opname, **attrs):
    return _unary(lambda low, x, node: low.op(opname, x, **attrs))


for _tf, _op in [("Relu", "relu"), ("Sigmoid", "sigmoid"), ("Tanh", "tanh"), ("Sqrt", "sqrt"),
                 ("Rsqrt", "rsqrt"), ("Exp", "exp"), ("Log", "log"), ("Neg", "neg"), ("Abs", "abs"),
                 ("Erf", "erf"), ("Reciprocal", "reciprocal"), ("Inv", "reciprocal")]:
    handles(_tf)(_simple(f"cuvil.{_op}"))
handles("Relu6")(_simple("cuvil.clamp", min=0.0, max=6.0))
handles("Elu")(_simple("cuvil.elu", alpha=1.0))


@handles("LeakyRelu")
@_unary
def _leaky_relu(low, x, node):
    return low.op("cuvil.leaky_relu", x, slope=float(node.attr("alpha", 0.2)))


@handles("Selu")
@_unary
def _selu(low, x, node):
    y = low.op("cuvil.elu", x, alpha=1.6732632423543772)
    return low.op("cuvil.mul", y, low.const(1.0507009873554805, x.dtype))


@handles("Erfc")
@_unary
def _erfc(low, x, node):
    return low.op("cuvil.sub", low.const(1.0, x.dtype), low.op("cuvil.erf", x))


@handles("Square")
@_unary
def _square(low, x, node):
    return low.op("cuvil.mul", x, x)


@handles("Softplus")
@_unary
def _softplus(low, x, node):
    soft = low.op("cuvil.log", low.op("cuvil.add", low.op("cuvil.exp", x), low.const(1.0, x.dtype)))
    return low.op("cuvil.where", low.op("cuvil.gt", x, low.const(20.0, x.dtype)), x, soft)


@handles("Softsign")
@_unary
def _softsign(low, x, node):
    return low.op("cuvil.div", x, low.op("cuvil.add", low.op("cuvil.abs", x), low.const(1.0, x.dtype)))


@handles("Cast")
@_unary
def _cast(low, x, node):
    return low.cast(x, cuvil_dtype(node.attr("DstT")))


@handles("LogicalNot")
@_unary
def _logical_not(low, x, node):
    return low.op("cuvil.eq", x, low.const(False, "bool"))


def _binary(fn):
    """Elementwise on two operands with broadcasting; in NCHW when either operand is held
    there and the other can follow (rank <= 4)."""
    def handler(low, node):
        ka, kb = node.inputs[:2]
        a, b = (low.env.get(k) for k in (ka, kb))
        if (low.has_nchw(ka) or low.has_nchw(kb)) and all(
                low.has_nchw(k) or low.get(k).type.rank <= 4 for k in (ka, kb)):
            a = low.nchw(ka) if low.has_nchw(ka) else low.to_nchw(low.get(ka))
            b = low.nchw(kb) if low.has_nchw(kb) else low.to_nchw(low.get(kb))
            return NCHW(fn(low, a, b))
        return fn(low, low.get(ka), low.get(kb))
    return handler


def _bin_op(opname):
    return _binary(lambda low, a, b: low.op(opname, a, b))


for _tf, _op in [("Add", "add"), ("AddV2", "add"), ("Sub", "sub"), ("Mul", "mul"), ("RealDiv", "div"),
                 ("Maximum", "maximum"), ("Minimum", "minimum"), ("Pow", "pow"), ("Equal", "eq"),
                 ("NotEqual", "ne"), ("Less", "lt"), ("LessEqual", "le"), ("Greater", "gt"),
                 ("GreaterEqual", "ge"), ("LogicalAnd", "and"), ("LogicalOr", "or")]:
    handles(_tf)(_bin_op(f"cuvil.{_op}"))


@handles("Div", "FloorDiv")
@_binary
def _div(low, a, b):
    if a.dtype in ("f32", "f16", "f64"):
        if low.where.endswith("(FloorDiv)"):
            raise UnsupportedOpError("floor division of floats is not supported")
        return low.op("cuvil.div", a, b)
    if low.where.endswith("(Div)"):
        raise UnsupportedOpError("integer Div (truncating) is not supported; use // (FloorDiv)")
    return low.op("cuvil.div", a, b)  # integer cuvil.div floors


@handles("SquaredDifference")
@_binary
def _squared_difference(low, a, b):
    d = low.op("cuvil.sub", a, b)
    return low.op("cuvil.mul", d, d)


@handles("BiasAdd", "BiasAddV1")
def _bias_add(low, node):
    if node.attr("data_format", "NHWC") == "NCHW":
        x, b = operand(low, node, 0), operand(low, node, 1)
        return low.op("cuvil.add", x, low.reshape(b, [1, b.shape[0]] + [1] * (x.type.rank - 2)))
    return _bin_op("cuvil.add")(low, node)  # the bias is on the last dim: plain broadcasting


@handles("AddN")
def _add_n(low, node):
    keys = list(node.inputs)
    if len(keys) == 1:
        return _identity(low, node)
    nchw = all(low.has_nchw(k) for k in keys)
    vals = [low.nchw(k) if nchw else low.get(k) for k in keys]
    y = vals[0]
    for v in vals[1:]:
        y = low.op("cuvil.add", y, v)
    return NCHW(y) if nchw else y


@handles("ClipByValue")
def _clip(low, node):
    x, lo, hi = (operand(low, node, i) for i in range(3))
    clo, chi = const_array(lo), const_array(hi)
    if clo is not None and chi is not None and clo.size == 1 and chi.size == 1:
        cast = float if x.dtype in ("f32", "f16", "f64") else int
        return _simple("cuvil.clamp", min=cast(clo.reshape(())), max=cast(chi.reshape(())))(low, node)
    return low.op("cuvil.maximum", low.op("cuvil.minimum", x, hi), lo)


@handles("Select", "SelectV2")
def _select(low, node):
    c, a, b = (operand(low, node, i) for i in range(3))
    if node.op == "Select" and c.type.rank == 1 and a.type.rank > 1:  # v1: condition picks rows
        c = low.reshape(c, [c.shape[0]] + [1] * (a.type.rank - 1))
    return low.op("cuvil.where", c, a, b)


# -- matrix products --------------------------------------------------------------------------------
def _swap_last(low, v: Value) -> Value:
    perm = list(range(v.type.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return low.transpose(v, perm)


@handles("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def _matmul(low, node):
    a, b = operand(low, node, 0), operand(low, node, 1)
    ta = node.attr("transpose_a", False) or node.attr("adj_x", False)
    tb = node.attr("transpose_b", False) or node.attr("adj_y", False)
    y = low.op("cuvil.matmul", _swap_last(low, a) if ta else a, _swap_last(low, b) if tb else b)
    tout = node.attr("Tout")
    return low.cast(y, cuvil_dtype(tout)) if tout is not None else y


@handles("Einsum")
def _einsum(low, node):
    return lower_einsum(low, node.attr("equation"), [low.get(k) for k in node.inputs])


# -- convolution, normalisation, pooling --------------------------------------------------------------
def _spatial(node, key: str, default) -> list[int]:
    """The H and W entries of a 4-entry per-dim attribute in the node's data format."""
    v = node.attr(key) or default
    return [v[1], v[2]] if node.attr("data_format", "NHWC") == "NHWC" else [v[2], v[3]]


def _pads(node, h: int, w: int, kh: int, kw: int, stride, dilation) -> list[int]:
    padding = node.attr("padding")
    if padding == "VALID":
        return [0, 0, 0, 0]
    if padding == "SAME":
        (t, b), (l, r) = same_pads(h, kh, stride[0], dilation[0]), same_pads(w, kw, stride[1], dilation[1])
        return [t, l, b, r]
    if padding == "EXPLICIT":
        e = node.attr("explicit_paddings")
        (t, b), (l, r) = ((e[2], e[3]), (e[4], e[5])) if node.attr("data_format", "NHWC") == "NHWC" \
            else ((e[4], e[5]), (e[6], e[7]))
        return [t, l, b, r]
    raise UnsupportedOpError(f"padding {padding!r} is not supported")


def _nchw_input(low, node):
    """(the input in NCHW form, whether the node works in NHWC)."""
    nhwc = node.attr("data_format", "NHWC") == "NHWC"
    if node.attr("data_format", "NHWC") not in ("NHWC", "NCHW"):
        raise UnsupportedOpError(f"data_format {node.attr('data_format')!r} is not supported")
    return (low.nchw(node.inputs[0]) if nhwc else operand(low, node, 0)), nhwc


def _dilated_conv_pattern(low, node):
    """SpaceToBatchND -> conv (VALID, stride 1) -> BatchToSpaceND with one block shape is
    how TensorFlow runs a dilated convolution: (S2B node, B2S node) or None."""
    s2b = low.nodes.get(node.inputs[0][0])
    users = low.consumers.get(node.name, [])
    if s2b is None or s2b.op != "SpaceToBatchND" or len(users) != 1 or users[0].op != "BatchToSpaceND":
        return None
    b2s = users[0]
    if node.attr("padding") != "VALID" or node.attr("data_format", "NHWC") != "NHWC" or \
            list(node.attr("strides")) != [1, 1, 1, 1] or list(node.attr("dilations") or [1] * 4) != [1] * 4:
        return None
    block = low.env.get(s2b.inputs[1])
    block2 = low.env.get(b2s.inputs[1])
    if block is None or block2 is None or const_array(block) is None or const_array(block2) is None or \
            list(const_array(block)) != list(const_array(block2)) or len(const_array(block)) != 2:
        return None
    return s2b, b2s


@handles("Conv2D", "DepthwiseConv2dNative")
def _conv2d(low, node):
    pattern = _dilated_conv_pattern(low, node)
    if pattern is not None:
        s2b, b2s = pattern
        x = low.nchw(s2b.inputs[0])
        dilation = [int(b) for b in low.static(low.get(s2b.inputs[1]), "the block shape")]
        (pt, pb), (pl, pr) = low.static(low.get(s2b.inputs[2]), "the paddings").tolist()
        (ct, cb), (cl, cr) = low.static(low.get(b2s.inputs[2]), "the crops").tolist()
        y = _conv_core(low, node, x, [1, 1], dilation, [pt, pl, pb, pr])
        for dim, lo, hi in ((2, ct, cb), (3, cl, cr)):
            y = low.slice(y, dim, lo, y.shape[dim] - hi)
        low.pending[b2s.name] = NCHW(y)
        return None
    x, nhwc = _nchw_input(low, node)
    stride, dilation = _spatial(node, "strides", [1, 1, 1, 1]), _spatial(node, "dilations", [1, 1, 1, 1])
    kh, kw = operand(low, node, 1).shape[:2]
    pads = _pads(node, x.shape[2], x.shape[3], kh, kw, stride, dilation)
    y = _conv_core(low, node, x, stride, dilation, pads)
    return NCHW(y) if nhwc else y


def _conv_core(low, node, x, stride, dilation, pads):
    f = operand(low, node, 1)  # [KH, KW, C/groups, OC] or depthwise [KH, KW, C, M]
    kh, kw, fin, fout = f.shape
    c = x.shape[1]
    if node.op == "DepthwiseConv2dNative":
        w = low.reshape(low.transpose(f, [2, 3, 0, 1]), [fin * fout, 1, kh, kw])
        groups = c
    else:
        if c % fin:
            raise UnsupportedOpError(f"{c} input channels are not a multiple of the filter's {fin}")
        w, groups = low.transpose(f, [3, 2, 0, 1]), c // fin
    return low.op("cuvil.conv2d", x, w, stride=stride, dilation=dilation, pads=pads, groups=groups)


@handles("SpaceToBatchND")
def _space_to_batch(low, node):
    x = operand(low, node)
    block = [int(b) for b in static_operand(low, node, 1, "the block shape")]
    pads = static_operand(low, node, 2, "the paddings").tolist()
    if x.type.rank != 4 or len(block) != 2:
        raise UnsupportedOpError("SpaceToBatchND is supported on 4-D NHWC tensors with a 2-D block")
    (bh, bw), (n, _, _, c) = block, x.shape
    x = low.op("cuvil.pad", x, pads=[[0, 0], *pads, [0, 0]], value=0.0)
    h, w = x.shape[1] // bh, x.shape[2] // bw
    x = low.transpose(low.reshape(x, [n, h, bh, w, bw, c]), [2, 4, 0, 1, 3, 5])
    return low.reshape(x, [bh * bw * n, h, w, c])


@handles("BatchToSpaceND")
def _batch_to_space(low, node):
    if node.name in low.pending:  # the end of a dilated convolution, already lowered
        return low.pending.pop(node.name)
    x = operand(low, node)
    block = [int(b) for b in static_operand(low, node, 1, "the block shape")]
    (ct, cb), (cl, cr) = static_operand(low, node, 2, "the crops").tolist()
    if x.type.rank != 4 or len(block) != 2:
        raise UnsupportedOpError("BatchToSpaceND is supported on 4-D NHWC tensors with a 2-D block")
    (bh, bw), (nb, h, w, c) = block, x.shape
    n = nb // (bh * bw)
    x = low.transpose(low.reshape(x, [bh, bw, n, h, w, c]), [2, 3, 0, 4, 1, 5])
    x = low.reshape(x, [n, h * bh, w * bw, c])
    return low.slice(low.slice(x, 1, ct, h * bh - cb), 2, cl, w * bw - cr)


@handles("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def _fused_batch_norm(low, node):
    if node.attr("is_training", False):
        raise UnsupportedOpError("batch norm in training mode (call the model with training=False)")
    x, nhwc = _nchw_input(low, node)
    scale, offset, mean, var = (operand(low, node, i) for i in range(1, 5))
    y = low.op("cuvil.batch_norm", x, mean, var, scale, offset, eps=float(node.attr("epsilon", 1e-3)))
    return [NCHW(y) if nhwc else y, None, None, None, None, None]


@handles("MaxPool", "AvgPool")
def _pool(low, node):
    x, nhwc = _nchw_input(low, node)
    (kh, kw), stride = _spatial(node, "ksize", None), _spatial(node, "strides", None)
    pads = _pads(node, x.shape[2], x.shape[3], kh, kw, stride, [1, 1])
    if node.op == "MaxPool":
        y = low.op("cuvil.max_pool2d", x, kernel=[kh, kw], stride=stride, pads=pads, dilation=[1, 1],
                   ceil_mode=False)
    else:  # TensorFlow averages over the window's valid elements only
        y = low.op("cuvil.avg_pool2d", x, kernel=[kh, kw], stride=stride, pads=pads, ceil_mode=False,
                   count_include_pad=False, divisor=0)
    return NCHW(y) if nhwc else y


# -- reductions and softmax -------------------------------------------------------------------------
def _reduce(opname):
    def handler(low, node):
        key = node.inputs[0]
        x = low.env.get(key) or low.nchw_env[key]
        axes = sorted({norm_axis(a, x.type.rank) for a in np.ravel(static_operand(low, node, 1, "the axes"))})
        keep = bool(node.attr("keep_dims", False))
        if not axes:
            return _identity(low, node)
        if low.has_nchw(key):
            y = low.op(opname, low.nchw(key), axes=sorted(NHWC_TO_NCHW.index(a) for a in axes), keepdims=keep)
            if keep:
                return NCHW(y)
            rest = [d for d in NHWC_TO_NCHW if d not in axes]  # NHWC dims in y's order
            return low.transpose(y, sorted(range(len(rest)), key=lambda i: rest[i]))
        return low.op(opname, low.get(key), axes=axes, keepdims=keep)
    return handler


for _tf, _op in [("Mean", "reduce_mean"), ("Sum", "reduce_sum"), ("Max", "reduce_max"), ("Min", "reduce_min")]:
    handles(_tf)(_reduce(f"cuvil.{_op}"))


@handles("Softmax", "LogSoftmax")
def _softmax(low, node):
    x = operand(low, node)
    return low.op("cuvil.softmax" if node.op == "Softmax" else "cuvil.log_softmax", x, axis=x.type.rank - 1)

