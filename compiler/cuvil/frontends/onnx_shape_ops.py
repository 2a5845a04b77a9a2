"""ONNX shape and data-movement ops (Reshape, Slice, Pad, Gather, ...), registered into
the HANDLERS table of onnx_common.py. Shape operands must be constants (after folding)."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import symdim
from ..ir import Value
from ..ir.types import FLOAT_DTYPES, broadcast_shapes
from .graph import const_array, symbolic_slice
from .onnx_common import handles, int_list, norm_axis, operand, scalar


# -- shapes -------------------------------------------------------------------------------------
@handles("Reshape")
def _reshape(low, node):
    x = operand(low, node)
    spec = int_list(low, node, 1, "the shape", "shape")
    allow_zero = node.attr("allowzero", 0)
    spec = [x.shape[i] if d == 0 and not allow_zero else d for i, d in enumerate(spec)]
    if -1 in spec:
        known = symdim.product([d for d in spec if d != -1])
        rest = symdim.exact_div(x.type.numel_dim, known) if known != 0 else 0
        if rest is None:
            raise UnsupportedOpError(f"Reshape of {x.type} to {spec}: {x.type.numel_dim} elements do not divide by {known}")
        spec[spec.index(-1)] = rest
    return low.reshape(x, spec)


@handles("Flatten")
def _flatten(low, node):
    x = operand(low, node)
    axis = int(node.attr("axis", 1))
    axis = axis + x.type.rank if axis < 0 else axis
    return low.reshape(x, [symdim.product(x.shape[:axis]), symdim.product(x.shape[axis:])])


@handles("Squeeze")
def _squeeze(low, node):
    x = operand(low, node)
    axes = int_list(low, node, 1, "the axes", "axes")
    axes = {norm_axis(a, x.type.rank) for a in axes} if axes else None
    return low.reshape(x, [d for i, d in enumerate(x.shape) if not (d == 1 and (axes is None or i in axes))])


@handles("Unsqueeze")
def _unsqueeze(low, node):
    x = operand(low, node)
    axes = int_list(low, node, 1, "the axes", "axes")
    rank = x.type.rank + len(axes)
    axes = sorted(norm_axis(a, rank) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return low.reshape(x, shape)


@handles("Transpose")
def _transpose(low, node):
    x = operand(low, node)
    perm = node.attr("perm") or list(range(x.type.rank))[::-1]
    return low.transpose(x, perm)


@handles("Concat")
def _concat(low, node):
    vals = [low.get(n) for n in node.inputs if n]
    return low.concat(vals, norm_axis(node.attr("axis"), vals[0].type.rank))


@handles("Split")
def _split(low, node):
    x = operand(low, node)
    ax = norm_axis(node.attr("axis", 0), x.type.rank)
    sizes = int_list(low, node, 1, "the split sizes", "split")
    n_out = len(node.outputs)
    if not sizes:
        n = x.shape[ax]
        chunk = -(-n // n_out)
        sizes = [min(chunk, n - i * chunk) for i in range(n_out)]
    outs, start = [], 0
    for s in sizes:
        outs.append(low.slice(x, ax, start, start + s))
        start += s
    return outs


@handles("Slice")
def _slice(low, node):
    x = operand(low, node)
    if low.opset < 10:
        starts, ends, axes, steps = node.attr("starts"), node.attr("ends"), node.attr("axes"), None
    else:
        starts, ends = int_list(low, node, 1, "the starts"), int_list(low, node, 2, "the ends")
        axes, steps = int_list(low, node, 3, "the axes"), int_list(low, node, 4, "the steps")
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    arr = const_array(x)
    index = [slice(None)] * x.type.rank
    for a, s, e, k in zip(axes, starts, ends, steps):
        index[norm_axis(a, x.type.rank)] = slice(s, e, k)
    symbolic_bounds = any(isinstance(b, str) for sl in index for b in (sl.start, sl.stop))
    if arr is not None and not symbolic_bounds:
        return low.const(np.array(arr[tuple(index)]))
    for d, sl in enumerate(index):
        if isinstance(x.shape[d], str) or isinstance(sl.start, str) or isinstance(sl.stop, str):
            x = symbolic_slice(low, x, d, sl.start, sl.stop, sl.step, "Slice")
            continue
        start, stop, step = sl.indices(x.shape[d])
        if step < 1:  # a reversed range: gather its indices
            x = low.op("cuvil.gather", x, low.const(np.arange(start, stop, step, dtype=np.int64)), axis=d)
        else:
            x = low.slice(x, d, start, stop, step)
    return x


@handles("Pad")
def _pad(low, node):
    x = operand(low, node)
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise UnsupportedOpError(f"Pad mode {mode!r} is not supported")
    if low.opset < 11:
        flat, value, axes = node.attr("pads"), float(node.attr("value", 0.0)), None
    else:
        flat = int_list(low, node, 1, "the pads")
        value = scalar(low, node, 2, "the padding value")
        value = 0.0 if value is None else float(value)
        axes = int_list(low, node, 3, "the axes")
    axes = [norm_axis(a, x.type.rank) for a in axes] if axes else list(range(x.type.rank))
    k = len(axes)
    pads = [[0, 0] for _ in range(x.type.rank)]
    for j, a in enumerate(axes):
        pads[a] = [flat[j], flat[j + k]]
    for d, (lo, hi) in enumerate(pads):  # negative pads crop
        if lo < 0 or hi < 0:
            x = low.slice(x, d, max(-lo, 0), x.shape[d] - max(-hi, 0))
            pads[d] = [max(lo, 0), max(hi, 0)]
    if all(p == [0, 0] for p in pads):
        return x
    if mode != "constant":  # each padded dim: one gather of the source index per position
        for d, (lo, hi) in enumerate(pads):
            if lo or hi:
                x = low.op("cuvil.gather", x, low.const(_pad_source(mode, x.shape[d], lo, hi)), axis=d)
        return x
    if x.dtype not in FLOAT_DTYPES:
        value = int(value)
    return low.op("cuvil.pad", x, pads=pads, value=value)


def _pad_source(mode: str, n: int, lo: int, hi: int) -> np.ndarray:
    """For each output position of a dim padded by (lo, hi): the input index it copies."""
    i = np.arange(-lo, n + hi, dtype=np.int64)
    if mode == "edge":
        return np.clip(i, 0, n - 1)
    if mode == "wrap":
        return np.mod(i, n)
    if n == 1:  # reflect
        return np.zeros_like(i)
    period = 2 * (n - 1)
    i = np.mod(i, period)
    return np.where(i < n, i, period - i)


@handles("Expand")
def _expand(low, node):
    x = operand(low, node)
    shape = broadcast_shapes(tuple(x.shape), tuple(int_list(low, node, 1, "the shape")))
    return low.broadcast(x, shape)


@handles("Tile")
def _tile(low, node):
    x = operand(low, node)
    reps = int_list(low, node, 1, "the repeats")
    inter, full = [], []
    for r, d in zip(reps, x.shape):
        inter += [1, d]
        full += [r, d]
    y = low.broadcast(low.reshape(x, inter), full)
    return low.reshape(y, [r * d for r, d in zip(reps, x.shape)])


def _wrap(low, idx: Value, n: int) -> Value:
    """Indices in [-n, n) -> [0, n)."""
    arr = const_array(idx)
    if arr is not None and (arr >= 0).all():
        return idx
    neg = low.op("cuvil.lt", idx, low.const(0, idx.dtype))
    return low.op("cuvil.where", neg, low.op("cuvil.add", idx, low.const(n, idx.dtype)), idx)


@handles("Gather")
def _gather(low, node):
    x, idx = operand(low, node, 0), operand(low, node, 1)
    ax = norm_axis(node.attr("axis", 0), x.type.rank)
    return low.op("cuvil.gather", x, _wrap(low, idx, x.shape[ax]), axis=ax)


@handles("GatherElements")
def _gather_elements(low, node):
    """out[i] = x[i with index[i] at axis]: one gather over the flattened x."""
    x, idx = operand(low, node, 0), operand(low, node, 1)
    rank = x.type.rank
    ax = norm_axis(node.attr("axis", 0), rank)
    strides = [int(np.prod(x.shape[k + 1:], dtype=np.int64)) for k in range(rank)]
    grid = np.zeros(idx.shape, np.int64)
    for k in range(rank):
        if k != ax:
            shape = [1] * rank
            shape[k] = idx.shape[k]
            grid = grid + np.arange(idx.shape[k], dtype=np.int64).reshape(shape) * strides[k]
    i = _wrap(low, low.cast(idx, "i64"), x.shape[ax])
    flat = low.op("cuvil.add", low.op("cuvil.mul", i, low.const(strides[ax], "i64")), low.const(grid))
    return low.op("cuvil.gather", low.reshape(x, [x.type.numel]), flat, axis=0)


@handles("DepthToSpace")
def _depth_to_space(low, node):
    x = operand(low, node)
    b = int(node.attr("blocksize"))
    n, c, h, w = x.shape
    if node.attr("mode", "DCR") == "DCR":
        y = low.transpose(low.reshape(x, [n, b, b, c // (b * b), h, w]), [0, 3, 4, 1, 5, 2])
    else:
        y = low.transpose(low.reshape(x, [n, c // (b * b), b, b, h, w]), [0, 1, 4, 2, 5, 3])
    return low.reshape(y, [n, c // (b * b), h * b, w * b])


@handles("SpaceToDepth")
def _space_to_depth(low, node):
    x = operand(low, node)
    b = int(node.attr("blocksize"))
    n, c, h, w = x.shape
    perm = [0, 3, 5, 1, 2, 4] if node.attr("mode", "DCR") == "DCR" else [0, 1, 3, 5, 2, 4]
    y = low.transpose(low.reshape(x, [n, c, h // b, b, w // b, b]), perm)
    return low.reshape(y, [n, c * b * b, h // b, w // b])
