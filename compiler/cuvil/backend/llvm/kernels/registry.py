"""The emitter of each op: what the code generator calls to emit an op's kernel (the
quantized conv2d / matmul emitters are quantized.EMITTERS).
"""
from __future__ import annotations

from .attention import k_attention
from .conv import k_conv2d
from .data import k_broadcast_to, k_concat, k_copy, k_dim, k_gather, k_pad, k_resize, k_slice, k_transpose
from .dynamic import k_nms, k_nonzero, k_unique, k_unique_counts, k_unique_inverse
from .elementwise import k_fused
from .matmul import k_matmul
from .pooling import k_adaptive_avg_pool2d, k_avg_pool2d, k_max_pool2d
from .reduce import arg_reduce_kernel, reduce_kernel, scan_kernel
from .rows import k_batch_norm, k_layer_norm, k_log_softmax, k_softmax


EMITTERS = {
    "cuvil.dim": k_dim,
    "cuvil.fused": k_fused,
    "cuvil.matmul": k_matmul,
    "cuvil.conv2d": k_conv2d,
    "cuvil.max_pool2d": k_max_pool2d,
    "cuvil.avg_pool2d": k_avg_pool2d,
    "cuvil.adaptive_avg_pool2d": k_adaptive_avg_pool2d,
    "cuvil.softmax": k_softmax,
    "cuvil.attention": k_attention,
    "cuvil.log_softmax": k_log_softmax,
    "cuvil.layer_norm": k_layer_norm,
    "cuvil.batch_norm": k_batch_norm,
    "cuvil.reduce_sum": reduce_kernel("sum"),
    "cuvil.reduce_mean": reduce_kernel("mean"),
    "cuvil.reduce_max": reduce_kernel("max"),
    "cuvil.reduce_min": reduce_kernel("min"),
    "cuvil.reduce_prod": reduce_kernel("prod"),
    "cuvil.cumsum": scan_kernel("sum"),
    "cuvil.cumprod": scan_kernel("prod"),
    "cuvil.argmax": arg_reduce_kernel("max"),
    "cuvil.nonzero": k_nonzero,
    "cuvil.unique": k_unique,
    "cuvil.unique_inverse": k_unique_inverse,
    "cuvil.unique_counts": k_unique_counts,
    "cuvil.argmin": arg_reduce_kernel("min"),
    "cuvil.reshape": k_copy,
    "cuvil.transpose": k_transpose,
    "cuvil.broadcast_to": k_broadcast_to,
    "cuvil.slice": k_slice,
    "cuvil.concat": k_concat,
    "cuvil.pad": k_pad,
    "cuvil.gather": k_gather,
    "cuvil.resize": k_resize,
    "cuvil.nms": k_nms,
}
