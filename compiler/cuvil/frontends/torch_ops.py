"""Handlers lowering ATen ops to Cuvil IR, keyed by schema name ('aten::conv2d') in
HANDLERS here; the shape and data-movement ops are in torch_shape_ops.py, composite ops
in torch_composite.py, Hugging Face patterns in torch_hf.py, PT2E quantization in
torch_quant.py (torch.handlers() imports them all).

Each handler takes the Lowering state and the node's arguments bound to schema names,
and returns a Value (or a list of Values for multi-output ops).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from ..ir.types import FLOAT_DTYPES
from .graph import registrar

HANDLERS: dict = {}


handles = registrar(HANDLERS, lambda n: n if "::" in n or n == "getitem" else f"aten::{n}")


def norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def pair(v, n=2):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


# -- elementwise ------------------------------------------------------------------------
def _operand(low, x, dtype: str) -> Value:
    if isinstance(x, Value):
        return low.cast(x, dtype)
    if isinstance(x, str):  # a symbolic size used as a number (x.shape[0], a nonzero count)
        return low.cast(low.op("cuvil.dim", dims=[x]), dtype)
    return low.const(np.asarray(x), dtype=dtype)


def _compute_dtype(low, *xs) -> str:
    tensors = [x for x in xs if isinstance(x, Value)]
    floats = [t.dtype for t in tensors if t.dtype in FLOAT_DTYPES]
    if floats:
        return floats[0]
    if any(isinstance(x, float) for x in xs):
        return "f32"
    if tensors:
        ints = [t.dtype for t in tensors if t.dtype != "bool"]
        return ints[0] if ints else "bool"
    return low.meta_type().dtype


def _binary(opname: str):
    def handler(low, a):
        x, y = a["self"], a["other"] if "other" in a else a.get("exponent")
        dtype = low.meta_type().dtype
        alpha = a.get("alpha", 1)
        if alpha not in (None, 1):
            y = low.op("cuvil.mul", _operand(low, y, dtype), _operand(low, alpha, dtype))
        return low.op(opname, _operand(low, x, dtype), _operand(low, y, dtype))
    return handler


for _n, _op in [("add", "add"), ("add_", "add"), ("sub", "sub"), ("sub_", "sub"), ("mul", "mul"),
                ("mul_", "mul"), ("pow", "pow"), ("maximum", "maximum"), ("minimum", "minimum")]:
    handles(_n)(_binary(f"cuvil.{_op}"))


@handles("rsub")
def _rsub(low, a):
    dtype = low.meta_type().dtype
    y = _operand(low, a["self"], dtype)
    if a.get("alpha", 1) != 1:
        y = low.op("cuvil.mul", y, _operand(low, a["alpha"], dtype))
    return low.op("cuvil.sub", _operand(low, a["other"], dtype), y)


def _compare(opname):
    def handler(low, a):
        x, y = a["self"], a["other"]
        dtype = _compute_dtype(low, x, y)
        return low.op(opname, _operand(low, x, dtype), _operand(low, y, dtype))
    return handler


for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    handles(_n)(_compare(f"cuvil.{_n}"))


def _unary(opname, **fixed):
    def handler(low, a):
        x = a["self"] if "self" in a else a["input"]
        dtype = low.meta_type().dtype
        return low.op(opname, low.cast(x, dtype), **fixed)
    return handler


for _n, _op in [("relu", "relu"), ("relu_", "relu"), ("sigmoid", "sigmoid"), ("sigmoid_", "sigmoid"),
                ("tanh", "tanh"), ("tanh_", "tanh"), ("silu", "silu"), ("silu_", "silu"),
                ("hardswish", "hardswish"), ("hardswish_", "hardswish"), ("hardsigmoid", "hardsigmoid"),
                ("hardsigmoid_", "hardsigmoid"), ("sqrt", "sqrt"), ("rsqrt", "rsqrt"), ("exp", "exp"),
                ("log", "log"), ("neg", "neg"), ("abs", "abs"), ("erf", "erf"), ("reciprocal", "reciprocal"),
                ("sin", "sin"), ("sin_", "sin"), ("cos", "cos"), ("cos_", "cos")]:
    handles(_n)(_unary(f"cuvil.{_op}"))


@handles("relu6")
def _relu6(low, a):
    return low.op("cuvil.clamp", a["self"], min=0.0, max=6.0)


@handles("hardtanh", "hardtanh_")
def _hardtanh(low, a):
    return low.op("cuvil.clamp", a["self"], min=float(a["min_val"]), max=float(a["max_val"]))


@handles("clamp", "clamp_", "clamp_min", "clamp_max")
def _clamp(low, a):
    x = a["self"]
    lo, hi = a.get("min"), a.get("max")
    if isinstance(lo, Value) or isinstance(hi, Value):
        dtype = x.dtype
        if lo is not None:
            x = low.op("cuvil.maximum", x, _operand(low, lo, dtype))
        if hi is not None:
            x = low.op("cuvil.minimum", x, _operand(low, hi, dtype))
        return x
    cast = float if x.dtype in FLOAT_DTYPES else int
    return low.op("cuvil.clamp", x, min=None if lo is None else cast(lo), max=None if hi is None else cast(hi))


@handles("gelu", "gelu_")
def _gelu(low, a):
    return low.op("cuvil.gelu", a["self"], approximate=a.get("approximate") or "none")


@handles("leaky_relu", "leaky_relu_")
def _leaky_relu(low, a):
    return low.op("cuvil.leaky_relu", a["self"], slope=float(a.get("negative_slope", 0.01)))


@handles("elu", "elu_")
def _elu(low, a):
    if a.get("scale", 1) != 1 or a.get("input_scale", 1) != 1:
        raise UnsupportedOpError("elu with scale/input_scale (selu) is not supported")
    return low.op("cuvil.elu", a["self"], alpha=float(a.get("alpha", 1.0)))


@handles("where")
def _where(low, a):
    dtype = low.meta_type().dtype
    return low.op("cuvil.where", low.cast(a["condition"], "bool"), _operand(low, a["self"], dtype),
                  _operand(low, a["other"], dtype))


@handles("min", "max")
def _min_max(low, a):
    """torch.min/max in its three forms: of two tensors (min.other: elementwise, NaN
    propagating like minimum/maximum), along a dim (min.dim: values and indices) and of
    the whole tensor (min(): a 0-d value)."""
    which = low.node.target._schema.name.split("::")[1]
    if "other" in a:
        return _binary(f"cuvil.{which}imum")(low, a)
    if "dim" in a:
        return _reduce_with_index(f"cuvil.reduce_{which}", f"cuvil.arg{which}")(low, a)
    x = a["self"]
    return low.op(f"cuvil.reduce_{which}", x, axes=list(range(x.type.rank)), keepdims=False)


@handles("triu", "tril", "triu_", "tril_")
def _triangle(low, a):
    """triu/tril as where(constant mask of the last two dims, x, 0): exact for inf/NaN."""
    x, k = a["self"], int(a.get("diagonal") or 0)
    which = low.node.target._schema.name.split("::")[1].rstrip("_")
    if x.type.rank < 2:
        raise UnsupportedOpError(f"aten.{which} needs at least 2 dims, got {x.type}")
    rows, cols = x.shape[-2:]
    if not (isinstance(rows, int) and isinstance(cols, int)):
        raise UnsupportedOpError(f"aten.{which} over symbolic dims {x.shape[-2:]} is not supported")
    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]  # j - i
    mask = offset >= k if which == "triu" else offset <= k
    return low.op("cuvil.where", low.const(mask, "bool"), x, low.const(np.zeros((), np.float64), x.dtype))


@handles("masked_fill", "masked_fill_")
def _masked_fill(low, a):
    x = a["self"]
    return low.op("cuvil.where", low.cast(a["mask"], "bool"), _operand(low, a["value"], x.dtype), x)


@handles("logical_not")
def _logical_not(low, a):
    return low.op("cuvil.eq", low.cast(a["self"], "bool"), low.const(False, "bool"))


@handles("to", "_to_copy", "type_as")
def _to(low, a):
    return low.cast(a["self"], low.meta_type().dtype)


@handles("contiguous", "clone", "alias", "detach", "detach_", "lift_fresh_copy")
def _identity(low, a):
    x = a.get("self", a.get("input"))
    return x


@handles("dropout", "dropout_", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")
def _dropout(low, a):
    if a.get("train") and a.get("p"):  # torch drops at random: identity would silently differ
        raise UnsupportedOpError("dropout with train=True is not supported (use model.eval() or training=False)")
    return a.get("self", a.get("input"))


@handles("_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size")
def _noop(low, a):
    return None


@handles("zeros_like", "ones_like", "full_like", "zeros", "ones", "full", "arange", "scalar_tensor",
         "new_zeros", "new_ones", "new_full", "empty_like")
def _creation(low, a):
    """Creation ops with static shapes: evaluate with torch at capture time."""
    node = low.node
    args = [a for a in node.args]
    kwargs = dict(node.kwargs)
    name = node.target._schema.name
    if name.endswith("_like") or name.startswith("aten::new_"):
        t = low.meta_type()
        fill = {"aten::zeros_like": 0, "aten::ones_like": 1, "aten::empty_like": 0, "aten::new_zeros": 0,
                "aten::new_ones": 1}.get(name)
        if fill is None:
            fill = a["fill_value"]
        if not t.is_static:  # a symbolic shape: one value broadcast at run time
            return low.op("cuvil.broadcast_to", low.const(np.full([1] * t.rank, fill, dtype=t.np_dtype)),
                          shape=list(t.shape))
        return low.const(np.full(t.shape, fill, dtype=t.np_dtype), t.dtype)  # float64 stays float64
    t = low.meta_type()
    if not t.is_static:
        return _symbolic_creation(low, a, name, t)
    kwargs.pop("device", None)
    kwargs.pop("pin_memory", None)
    return low.const(node.target(*args, **kwargs).numpy().copy())


def _symbolic_creation(low, a, name: str, t):
    """Creation ops whose shape is symbolic: a constant broadcast at run time (zeros, ones,
    full) or, for arange, the slice of a constant arange as long as the dim's upper bound."""
    from ..ir import symdim
    if name == "aten::arange":
        start = a.get("start") or 0
        step = a.get("step") or 1
        if not isinstance(start, (int, float)) or not isinstance(step, (int, float)) or t.rank != 1:
            raise UnsupportedOpError(f"arange with a symbolic start or step is not supported ({t})")
        bounds = {k: tuple(v) for k, v in (low.fn.attrs.get("dim_bounds") or {}).items()}
        n = symdim.upper_bound(t.shape[0], bounds)
        full = low.const((start + step * np.arange(n)).astype(t.np_dtype))
        return low.op("cuvil.slice", full, starts=[0], ends=[t.shape[0]], steps=[1])
    fill = {"aten::zeros": 0, "aten::ones": 1}.get(name, a.get("fill_value"))
    if fill is None:
        raise UnsupportedOpError(f"{name} with the symbolic shape {list(t.shape)} is not supported")
    return low.op("cuvil.broadcast_to", low.const(np.full([1] * t.rank, fill, dtype=t.np_dtype)),
                  shape=list(t.shape))


# -- matmul family ----------------------------------------------------------------------
def _transpose_last(low, w: Value) -> Value:
    perm = list(range(w.type.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return low.op("cuvil.transpose", w, perm=perm)


def _matmul(low, x: Value, y: Value) -> Value:
    """torch.matmul semantics incl. 1-D operands."""
    out_shape = list(low.meta_type().shape)
    xs = x if x.type.rank >= 2 else low.reshape(x, [1, x.shape[0]])
    ys = y if y.type.rank >= 2 else low.reshape(y, [y.shape[0], 1])
    r = _empty_product(low, xs, ys)
    r = low.op("cuvil.matmul", xs, ys) if r is None else r
    return low.reshape(r, out_shape)


def _empty_product(low, x: Value, y: Value):
    """A product with an empty dim (nothing to sum, or nothing to compute): zeros of its
    shape, built at capture; None otherwise."""
    if not (x.type.is_static and y.type.is_static and 0 in (*x.shape, *y.shape)):
        return None
    batch = np.broadcast_shapes(tuple(x.shape[:-2]), tuple(y.shape[:-2]))
    return low.const(np.zeros((*batch, x.shape[-2], y.shape[-1]), x.type.np_dtype))


@handles("matmul", "mm", "bmm")
def _mm(low, a):
    return _matmul(low, a["self"], a["other"] if "other" in a else a["mat2"])


@handles("linear")
def _linear(low, a):
    x, w, b = a["input"], a["weight"], a["bias"]
    y = _matmul(low, x, _transpose_last(low, w))
    return y if b is None else low.op("cuvil.add", y, b)


@handles("addmm")
def _addmm(low, a):
    y = _empty_product(low, a["mat1"], a["mat2"])
    y = low.op("cuvil.matmul", a["mat1"], a["mat2"]) if y is None else y
    beta, alpha = a.get("beta", 1), a.get("alpha", 1)
    if alpha != 1:
        y = low.op("cuvil.mul", y, low.const(float(alpha), y.dtype))
    bias = a["self"]
    if beta != 1:
        bias = low.op("cuvil.mul", bias, low.const(float(beta), y.dtype))
    return low.op("cuvil.add", y, bias)


@handles("t", "numpy_T")
def _t(low, a):
    x = a["self"]
    return x if x.type.rank < 2 else _transpose_last(low, x)


# -- convolution ------------------------------------------------------------------------
def _conv(low, x, w, b, stride, padding, dilation, groups):
    nd = w.type.rank - 2
    if x.type.rank == nd + 1:  # unbatched: [C, *S]
        y = _conv(low, low.reshape(x, [1, *x.shape]), w, b, stride, padding, dilation, groups)
        return low.reshape(y, list(y.shape[1:]))
    if any(not isinstance(d, int) for d in x.shape[2:]):
        raise UnsupportedOpError(f"conv{nd}d over the symbolic spatial dims {list(x.shape[2:])} is not supported "
                                 "(a symbolic batch is)")
    if nd == 1:  # conv1d as a conv2d with height 1
        x = low.reshape(x, [x.shape[0], x.shape[1], 1, x.shape[2]])
        w = low.reshape(w, [w.shape[0], w.shape[1], 1, w.shape[2]])
        stride, dilation = [1, *pair(stride, 1)], [1, *pair(dilation, 1)]
        padding = padding if isinstance(padding, str) else [0, *pair(padding, 1)]
    elif nd != 2:
        raise UnsupportedOpError(f"conv{nd}d is not supported (conv1d and conv2d are)")
    stride, dilation = pair(stride), pair(dilation)
    kh, kw = w.shape[2], w.shape[3]
    if isinstance(padding, str):
        if padding == "valid":
            pads = [0, 0, 0, 0]
        else:  # "same" (stride 1): extra padding goes at the end, as torch does
            th, tw = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
            pads = [th // 2, tw // 2, th - th // 2, tw - tw // 2]
    else:
        ph, pw = pair(padding)
        pads = [ph, pw, ph, pw]
    y = low.op("cuvil.conv2d", low.cast(x, w.dtype), w, stride=stride, dilation=dilation, pads=pads,
               groups=int(groups))
    if b is not None:
        y = low.op("cuvil.add", y, low.reshape(b, [1, b.shape[0], 1, 1]))
    if nd == 1:
        y = low.reshape(y, [y.shape[0], y.shape[1], y.shape[3]])
    return y


@handles("conv2d", "conv1d")
def _conv2d(low, a):
    return _conv(low, a["input"], a["weight"], a["bias"], a["stride"], a["padding"], a["dilation"], a["groups"])


@handles("convolution", "_convolution")
def _convolution(low, a):
    if a["transposed"]:
        raise UnsupportedOpError("transposed convolution is not supported")
    return _conv(low, a["input"], a["weight"], a["bias"], a["stride"], a["padding"], a["dilation"], a["groups"])


# -- normalisation ------------------------------------------------------------------------
def _bn_params(low, x, w, b, mean, var):
    c = x.shape[1]
    w = w if w is not None else low.const(np.ones(c, np.float32))
    b = b if b is not None else low.const(np.zeros(c, np.float32))
    return mean, var, w, b


@handles("batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm",
         "_native_batch_norm_legit")
def _batch_norm(low, a):
    x = a["input"]
    name = low.node.target._schema.name
    if x.type.is_static and x.type.numel == 0:  # an empty batch: empty outputs
        vals = low.meta() if isinstance(low.meta(), (list, tuple)) else [low.meta()]
        outs = [low.const(np.zeros([int(d) for d in v.shape], np.float32)) for v in vals]
        return outs[0] if name == "aten::batch_norm" else outs
    if a.get("training") and name != "aten::_native_batch_norm_legit_no_training":
        return _batch_norm_of_batch(low, a)
    mean, var, w, b = _bn_params(low, x, a["weight"], a["bias"], a["running_mean"], a["running_var"])
    y = low.op("cuvil.batch_norm", x, mean, var, w, b, eps=float(a["eps"]))
    if name == "aten::batch_norm":
        return y
    # native_batch_norm in eval mode: its save_mean / save_invstd outputs are empty
    return [y, *[low.const(np.zeros([int(d) for d in v.shape], np.float32)) for v in low.meta()[1:]]]


def _batch_norm_of_batch(low, a):
    """batch_norm with training=True: normalised by the batch's own mean and (biased)
    variance per channel, as torch computes it (the running statistics it would update
    are not outputs); native_batch_norm also returns that mean and 1/std."""
    x, eps = a["input"], float(a["eps"])
    axes = [0, *range(2, x.type.rank)]
    c = x.shape[1]
    mean = low.op("cuvil.reduce_mean", x, axes=axes, keepdims=True)
    d = low.op("cuvil.sub", x, mean)
    var = low.op("cuvil.reduce_mean", low.op("cuvil.mul", d, d), axes=axes, keepdims=True)
    invstd = low.op("cuvil.rsqrt", low.op("cuvil.add", var, low.const(np.asarray(eps), x.dtype)))
    y = low.op("cuvil.mul", d, invstd)
    shape = [1, c] + [1] * (x.type.rank - 2)
    if a.get("weight") is not None:
        y = low.op("cuvil.mul", y, low.reshape(a["weight"], shape))
    if a.get("bias") is not None:
        y = low.op("cuvil.add", y, low.reshape(a["bias"], shape))
    if low.node.target._schema.name == "aten::batch_norm":
        return y
    return [y, low.reshape(mean, [c]), low.reshape(invstd, [c])]


@handles("layer_norm", "native_layer_norm")
def _layer_norm(low, a):
    x = a["input"]
    k = len(a["normalized_shape"])
    params = [p for p in (a["weight"], a["bias"]) if p is not None]
    if a["weight"] is None and a["bias"] is not None:
        params = [low.const(np.ones(x.shape[-k:], np.float32)), a["bias"]]
    y = low.op("cuvil.layer_norm", x, *params, num_axes=k, eps=float(a["eps"]))
    if low.node.target._schema.name == "aten::layer_norm":
        return y
    # native_layer_norm's mean and 1/std over the normalised dims (kept as size 1)
    axes = list(range(x.type.rank - k, x.type.rank))
    mean = low.op("cuvil.reduce_mean", x, axes=axes, keepdims=True)
    d = low.op("cuvil.sub", x, mean)
    var = low.op("cuvil.reduce_mean", low.op("cuvil.mul", d, d), axes=axes, keepdims=True)
    rstd = low.op("cuvil.rsqrt", low.op("cuvil.add", var, low.const(np.asarray(float(a["eps"])), x.dtype)))
    return [y, mean, rstd]


# -- reductions and softmax -----------------------------------------------------------------
def reduce_axes(dims, rank):
    if dims is None or dims == [] or rank == 0:  # a 0-d tensor's dim 0 / -1 is the tensor itself
        return list(range(rank))
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return sorted({norm_dim(d, rank) for d in dims})


def _reduce(opname):
    def handler(low, a):
        x = a["self"]
        dtype = low.meta_type().dtype
        x = low.cast(x, dtype)
        keep = bool(a.get("keepdim", False))
        return low.op(opname, x, axes=reduce_axes(a.get("dim"), x.type.rank), keepdims=keep)
    return handler


handles("mean")(_reduce("cuvil.reduce_mean"))
handles("sum")(_reduce("cuvil.reduce_sum"))
handles("amax")(_reduce("cuvil.reduce_max"))
handles("amin")(_reduce("cuvil.reduce_min"))


def _arg_reduce(opname):
    """argmax / argmin; without `dim`, over the flattened tensor (a 0-d index)."""
    def handler(low, a):
        x, dim = a["self"], a.get("dim")
        keep = bool(a.get("keepdim", False))
        if dim is None:
            i = low.op(opname, low.reshape(x, [max(x.type.numel, 1)] if x.type.rank else []), axis=0,
                       keepdims=False)
            return low.reshape(i, [1] * x.type.rank) if keep else i
        return low.op(opname, x, axis=norm_dim(dim, max(x.type.rank, 1)) if x.type.rank else 0, keepdims=keep)
    return handler


def _reduce_with_index(reduce_op, arg_op):
    """max.dim / min.dim: (values, indices)."""
    def handler(low, a):
        x, keep = a["self"], bool(a.get("keepdim", False))
        if x.type.rank == 0:
            return x, low.op(arg_op, x, axis=0, keepdims=False)
        axis = norm_dim(a["dim"], x.type.rank)
        return (low.op(reduce_op, x, axes=[axis], keepdims=keep), low.op(arg_op, x, axis=axis, keepdims=keep))
    return handler


handles("argmax")(_arg_reduce("cuvil.argmax"))
handles("argmin")(_arg_reduce("cuvil.argmin"))


def _softmax(opname):
    def handler(low, a):
        dtype = low.meta_type().dtype
        x = low.cast(a["self"], "f32" if dtype == "f64" else dtype)  # the kernels have no f64 form
        if x.type.rank == 0:  # over the one element
            y = low.reshape(low.op(opname, low.reshape(x, [1]), axis=0), [])
        else:
            y = low.op(opname, x, axis=norm_dim(a["dim"], x.type.rank))
        return low.cast(y, dtype)
    return handler


handles("softmax", "_softmax")(_softmax("cuvil.softmax"))
handles("log_softmax", "_log_softmax")(_softmax("cuvil.log_softmax"))


# -- attention ----------------------------------------------------------------------------
@handles("scaled_dot_product_attention")
def _sdpa(low, a):
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if a.get("dropout_p"):  # random: ignoring it would silently differ
        raise UnsupportedOpError(f"scaled_dot_product_attention with dropout_p={a['dropout_p']} is not supported "
                                 "(use dropout_p=0.0 for inference)")
    if a.get("enable_gqa") and q.shape[-3] != k.shape[-3]:  # each key/value head serves hq/hk query heads
        k, v = (_repeat_heads(low, t, int(q.shape[-3]) // int(t.shape[-3])) for t in (k, v))
    d = q.shape[-1]
    scale = a.get("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    scores = low.op("cuvil.matmul", q, _transpose_last(low, k))
    scores = low.op("cuvil.mul", scores, low.const(scale, q.dtype))
    sq, sk = q.shape[-2], k.shape[-2]
    if a.get("is_causal"):
        causal = np.where(np.tril(np.ones((sq, sk), bool)), 0.0, -np.inf).astype(np.float32)
        scores = low.op("cuvil.add", scores, low.const(causal, q.dtype))
    if mask is not None:
        if mask.dtype == "bool":
            mask = low.op("cuvil.where", mask, low.const(0.0, q.dtype), low.const(-np.inf, q.dtype))
        scores = low.op("cuvil.add", scores, low.cast(mask, q.dtype))
    probs = low.op("cuvil.softmax", scores, axis=scores.type.rank - 1)
    return low.op("cuvil.matmul", probs, v)


def _repeat_heads(low, t: Value, r: int) -> Value:
    """[..., H, S, D] -> [..., H*r, S, D], each head repeated r times in place."""
    lead, (h, sl, d) = list(t.shape[:-3]), t.shape[-3:]
    t = low.reshape(t, [*lead, h, 1, sl, d])
    t = low.op("cuvil.broadcast_to", t, shape=[*lead, h, r, sl, d])
    return low.reshape(t, [*lead, h * r, sl, d])
