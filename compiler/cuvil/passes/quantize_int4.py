"""The int4_block rewrite of quantize-weights: one conv2d / matmul weight to Q4_0 blocks.

A weight becomes `cuvil.dequantize(u8 constant) {scheme = "int4_block"}` (the layout is
documented in ir/ops/quant.py): blocks of 32 along the reduction, per output channel,
one f16 scale per block; 18 bytes per 32 weights, 0.14 of the f32 bytes. The blocks run
along K of a matmul B [K, N] (one column of B per output channel) and along
IC/g * KH * KW of a conv2d weight [OC, IC/g, KH, KW].

Only weights that the backend's int4 GEMM kernels read get it: a 2-D matmul B with
K >= 32, a conv2d with a reduction of >= 32 and >= 4 output channels per group. Smaller
reductions (depthwise 3x3 convs: 9 weights per channel) would pad to 32 and save
nothing; those weights get fp16 instead.

With calibration inputs, a matmul's codes are chosen GPTQ-style (Frantar et al. 2022):
the reduction elements are rounded one at a time in order, and each rounding error is
spread over the elements not yet rounded through the inverse of H = X^T X (X: the
calibrated inputs of that matmul), so the product, not each weight, stays close. A
block's scale is still its (updated) largest-magnitude element / -8, the layout the same.
H is damped by 10% of its mean diagonal (GPTQ's paper uses 1%; on MiniLM with held-out
sentences 10% generalised better: lowest cosine 0.979 against 0.966). Convolutions keep
round-to-nearest.
"""
from __future__ import annotations

import numpy as np

from ..ir import Op
from ..ir.ops.quant import Q4_BLOCK_BYTES, QK, Dequantize, as_rows, q4_encode
from ..ir.ops.shape import Constant


def int4_layout(op: Op) -> int | None:
    """The out_axis of op's weight (operand 1) in int4_block, or None if it stays wider."""
    w = op.operands[1].type
    if op.name == "cuvil.matmul":
        return 1 if w.rank == 2 and w.shape[0] >= QK else None
    if op.name == "cuvil.conv2d":
        oc, icg, kh, kw = w.shape
        return 0 if icg * kh * kw >= QK and oc // op.attrs["groups"] >= 4 else None
    return None


def gptq_encode(rows: np.ndarray, h: np.ndarray, damp: float = 0.1, lazy: int = 128) -> np.ndarray:
    """[R, L] f32 weight rows and H [L, L] -> Q4_0 blocks [R, ceil(L/32), 18] (see above)."""
    r, length = rows.shape
    nb = -(-length // QK)
    w = np.zeros((r, nb * QK), np.float64)
    w[:, :length] = rows
    hp = np.eye(nb * QK)  # padded elements: independent, zero
    hp[:length, :length] = h
    dead = np.diag(hp) == 0
    hp[dead, dead] = 1.0
    w[:, dead] = 0.0
    hp += damp * np.mean(np.diag(hp)) * np.eye(len(hp))
    hinv = np.linalg.cholesky(np.linalg.inv(hp)).T  # upper triangular
    codes = np.zeros((r, nb * QK), np.uint8)
    scales = np.zeros((r, nb), np.float16)
    for i1 in range(0, nb * QK, lazy):
        i2 = min(i1 + lazy, nb * QK)
        w1, err1, h1 = w[:, i1:i2].copy(), np.zeros((r, i2 - i1)), hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            j = i1 + i
            if j % QK == 0:
                blk = w1[:, i:i + QK]
                d = np.take_along_axis(blk, np.abs(blk).argmax(1)[:, None], 1)[:, 0] / -8.0
                scales[:, j // QK] = d.astype(np.float16)
                d16 = scales[:, j // QK].astype(np.float64)
                inv = np.divide(1.0, d16, out=np.zeros_like(d16), where=d16 != 0)
            q = np.clip(np.floor(w1[:, i] * inv + 8.5), 0, 15)
            codes[:, j] = q
            e = (w1[:, i] - (q - 8) * d16) / h1[i, i]
            w1[:, i:] -= np.outer(e, h1[i, i:])
            err1[:, i] = e
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    c = codes.reshape(r, nb, QK)
    out = np.empty((r, nb, Q4_BLOCK_BYTES), np.uint8)
    out[..., :2] = scales.astype("<f2")[..., None].view(np.uint8)
    out[..., 2:] = c[..., :QK // 2] | (c[..., QK // 2:] << 4)
    return out


def int4_weight(fn, const: Op, out_axis: int, gram: np.ndarray | None = None):
    """Insert the quantized copy of `const` before it (GPTQ with the input gram matrix
    if given); return the dequantized value."""
    w = const.value.astype(np.float32)
    rows = as_rows(w, out_axis)
    q = Constant(q4_encode(rows) if gram is None else gptq_encode(rows, gram), f"{const.attrs['name']}.q4",
                 const.loc)
    fn.body.insert_before(const, q)
    dq = Dequantize([q.result], {"scheme": "int4_block", "shape": list(w.shape), "out_axis": out_axis},
                    loc=const.loc)
    fn.body.insert_before(const, dq)
    return dq.result
