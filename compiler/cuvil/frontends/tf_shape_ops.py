"""TensorFlow shape and data-movement ops (Reshape, StridedSlice, Pad, GatherV2, ...),
registered into the HANDLERS table of tf_common.py. Shape operands must be constants
(after folding); NCHW-held tensors stay in NCHW where the op allows (Pad, Concat)."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from .graph import const_array
from .tf_common import NCHW, NCHW_TO_NHWC, NHWC_TO_NCHW, handles, norm_axis, operand, static_operand


# -- shapes ---------------------------------------------------------------------------------------
def _node_shape(x: Value, spec) -> list[int]:
    spec = [int(d) for d in np.ravel(spec)]
    if spec.count(-1) > 1:
        raise UnsupportedOpError(f"reshape to {spec} has more than one -1")
    if -1 in spec:
        known = int(np.prod([d for d in spec if d != -1], dtype=np.int64))
        spec[spec.index(-1)] = x.type.numel // known if known else 0
    return spec


@handles("Reshape")
def _reshape(low, node):
    x = operand(low, node)
    return low.reshape(x, _node_shape(x, static_operand(low, node, 1, "the shape")))


@handles("Squeeze")
def _squeeze(low, node):
    x = operand(low, node)
    dims = {norm_axis(d, x.type.rank) for d in node.attr("squeeze_dims") or []}
    shape = [d for i, d in enumerate(x.shape) if not (d == 1 and (not dims or i in dims))]
    return low.reshape(x, shape)


@handles("ExpandDims")
def _expand_dims(low, node):
    x = operand(low, node)
    ax = norm_axis(int(np.ravel(static_operand(low, node, 1, "the axis"))[0]), x.type.rank + 1)
    shape = list(x.shape)
    shape.insert(ax, 1)
    return low.reshape(x, shape)


@handles("Transpose")
def _transpose(low, node):
    key = node.inputs[0]
    perm = [int(p) for p in static_operand(low, node, 1, "the permutation")]
    if low.has_nchw(key) and perm == NHWC_TO_NCHW:
        return low.nchw(key)
    if low.has_nchw(key) and perm == [0, 1, 2, 3]:
        return NCHW(low.nchw(key))
    return low.transpose(low.get(key), perm)


@handles("Shape", "Size", "Rank")
def _shape(low, node):
    key = node.inputs[0]
    x = low.env.get(key) or low.nchw_env[key]
    shape = list(x.shape)
    if key not in low.env:
        shape = [shape[p] for p in NCHW_TO_NHWC]
    value = {"Shape": shape, "Size": int(np.prod(shape, dtype=np.int64)), "Rank": len(shape)}[node.op]
    return low.const(np.asarray(value, dtype=np.dtype(node.attr("out_type") and _np_dtype(node.attr("out_type"))
                                                      or np.int32)))


def _np_dtype(tf_dtype):
    import tensorflow as tf
    return tf.as_dtype(tf_dtype).as_numpy_dtype


@handles("ConcatV2", "Concat")
def _concat(low, node):
    keys = node.inputs[:-1] if node.op == "ConcatV2" else node.inputs[1:]
    ax_key = node.inputs[-1] if node.op == "ConcatV2" else node.inputs[0]
    ax = int(np.ravel(low.static(low.get(ax_key), "the axis of Concat"))[0])
    ranks = {(low.env.get(k) or low.nchw_env[k]).type.rank for k in keys}
    rank = ranks.pop()
    ax = norm_axis(ax, rank)
    if rank == 4 and any(low.has_nchw(k) for k in keys):
        return NCHW(low.concat([low.nchw(k) for k in keys], NHWC_TO_NCHW.index(ax)))
    return low.concat([low.get(k) for k in keys], ax)


@handles("Pack")
def _pack(low, node):
    vals = [low.get(k) for k in node.inputs]
    ax = norm_axis(node.attr("axis", 0), vals[0].type.rank + 1)
    parts = [low.reshape(v, list(v.shape[:ax]) + [1] + list(v.shape[ax:])) for v in vals]
    return low.concat(parts, ax)


@handles("Unpack")
def _unpack(low, node):
    x = operand(low, node)
    ax = norm_axis(node.attr("axis", 0), x.type.rank)
    shape = [d for i, d in enumerate(x.shape) if i != ax]
    return [low.reshape(low.slice(x, ax, i, i + 1), shape) for i in range(x.shape[ax])]


@handles("Split")
def _split(low, node):
    x = low.get(node.inputs[1])
    ax = norm_axis(int(np.ravel(static_operand(low, node, 0, "the axis"))[0]), x.type.rank)
    n = int(node.attr("num_split"))
    size = x.shape[ax] // n
    return [low.slice(x, ax, i * size, (i + 1) * size) for i in range(n)]


@handles("SplitV")
def _split_v(low, node):
    x = operand(low, node)
    sizes = [int(s) for s in static_operand(low, node, 1, "the sizes")]
    ax = norm_axis(int(np.ravel(static_operand(low, node, 2, "the axis"))[0]), x.type.rank)
    if -1 in sizes:
        sizes[sizes.index(-1)] = x.shape[ax] - (sum(sizes) + 1)
    outs, start = [], 0
    for s in sizes:
        outs.append(low.slice(x, ax, start, start + s))
        start += s
    return outs


@handles("Pad", "PadV2")
def _pad(low, node):
    key = node.inputs[0]
    pads = [[int(lo), int(hi)] for lo, hi in static_operand(low, node, 1, "the paddings")]
    value = float(np.ravel(static_operand(low, node, 2, "the padding value"))[0]) if node.op == "PadV2" else 0.0
    if any(p < 0 for pair in pads for p in pair):
        raise UnsupportedOpError("negative paddings are not supported")
    if low.has_nchw(key):
        return NCHW(low.op("cuvil.pad", low.nchw(key), pads=[pads[p] for p in NHWC_TO_NCHW], value=value))
    return low.op("cuvil.pad", low.get(key), pads=pads, value=value)


@handles("Slice")
def _slice(low, node):
    x = operand(low, node)
    begin = [int(b) for b in static_operand(low, node, 1, "the begin")]
    size = [int(s) for s in static_operand(low, node, 2, "the size")]
    for d, (b, s) in enumerate(zip(begin, size)):
        x = low.slice(x, d, b, x.shape[d] if s == -1 else b + s)
    return x


def _bits(mask: int, j: int) -> bool:
    return bool((int(mask or 0) >> j) & 1)


@handles("StridedSlice")
def _strided_slice(low, node):
    x = operand(low, node)
    begin, end, strides = (list(map(int, static_operand(low, node, i, w))) for i, w in
                           ((1, "the begin"), (2, "the end"), (3, "the strides")))
    m = {k: node.attr(k, 0) for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask",
                                      "shrink_axis_mask")}
    index = []
    for j in range(len(begin)):
        if _bits(m["ellipsis_mask"], j):
            index.append(Ellipsis)
        elif _bits(m["new_axis_mask"], j):
            index.append(None)
        elif _bits(m["shrink_axis_mask"], j):
            index.append(begin[j])
        else:
            index.append(slice(None if _bits(m["begin_mask"], j) else begin[j],
                               None if _bits(m["end_mask"], j) else end[j], strides[j]))
    index = tuple(index)
    arr = const_array(x)
    if arr is not None:
        return low.const(np.array(arr[index]))
    probe = np.lib.stride_tricks.as_strided(np.zeros(1), shape=x.shape, strides=[0] * x.type.rank)
    out_shape = list(probe[index].shape)
    # Per input dim: the slice each index entry applies (ellipsis covers the rest).
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    dims = []
    for i in index:
        if i is Ellipsis:
            for _ in range(x.type.rank - n_real):
                dims.append(slice(None))
        elif i is not None:
            dims.append(slice(i, i + 1 if i != -1 else None) if isinstance(i, int) else i)
    for dim, s in enumerate(dims):
        start, stop, step = s.indices(x.shape[dim])
        if step < 1:
            raise UnsupportedOpError("strided slices with a negative stride are not supported")
        x = low.slice(x, dim, start, stop, step)
    return low.reshape(x, out_shape)


@handles("GatherV2", "Gather")
def _gather(low, node):
    x, idx = operand(low, node, 0), operand(low, node, 1)
    ax = 0 if node.op == "Gather" else norm_axis(int(np.ravel(static_operand(low, node, 2, "the axis"))[0]), x.type.rank)
    if int(node.attr("batch_dims", 0) or 0):
        raise UnsupportedOpError("gather with batch_dims is not supported")
    return low.op("cuvil.gather", x, idx, axis=ax)


@handles("Fill")
def _fill(low, node):
    shape = [int(d) for d in static_operand(low, node, 0, "the shape")]
    v = operand(low, node, 1)
    arr = const_array(v)
    return low.const(np.full(shape, arr, dtype=arr.dtype)) if arr is not None else low.broadcast(v, shape)


@handles("ZerosLike", "OnesLike")
def _zeros_like(low, node):
    x = operand(low, node)
    return low.const(np.full(x.shape, 0 if node.op == "ZerosLike" else 1, dtype=x.type.np_dtype))


@handles("Range")
def _range(low, node):
    start, limit, delta = (np.ravel(static_operand(low, node, i, w))[0] for i, w in
                           ((0, "the start"), (1, "the limit"), (2, "the delta")))
    return low.const(np.arange(start, limit, delta, dtype=_np_dtype(node.attr("Tidx"))))


@handles("BroadcastTo")
def _broadcast_to(low, node):
    return low.broadcast(operand(low, node), [int(d) for d in static_operand(low, node, 1, "the shape")])


@handles("Tile")
def _tile(low, node):
    x = operand(low, node)
    reps = [int(r) for r in static_operand(low, node, 1, "the multiples")]
    inter, full = [], []
    for r, d in zip(reps, x.shape):
        inter += [1, d]
        full += [r, d]
    y = low.broadcast(low.reshape(x, inter), full)
    return low.reshape(y, [r * d for r, d in zip(reps, x.shape)])
