"""Quantized weights: `cuvil.dequantize` and the block codecs it reads.

`cuvil.dequantize(q) {scheme, shape, out_axis}` turns a u8 constant `q` holding a
quantized weight back into the f32 weight of `shape`. `out_axis` is the weight's
output-channel axis (0 for conv2d [OC, IC/g, KH, KW], 1 for a matmul B [K, N]); the
reduction runs over the other axes in order, so the weight is a matrix of
(output channel) x (reduction) "rows".

scheme "int4_block" (ggml Q4_0 style): each row is padded with zeros to a multiple of
32 and cut into blocks of 32; a block is 18 bytes, an f16 scale d (little endian)
followed by 16 bytes qs; element j < 16 of the block is the low nibble of qs[j],
element j + 16 the high nibble of qs[j]; a nibble c means (c - 8) * d. d is the
element of largest magnitude divided by -8 (so that element gets code 0 exactly), the
others round to nearest. q is laid out [rows, blocks, 18].

scheme "int8_channel": operands (q i8 [rows, L], scale f32 [rows]), symmetric per
output channel: the weight is q * scale (q in -127..127, scale = max |w| / 127).

scheme "bf16": operand q u8 [rows, 2 * L], each row the L weights as little-endian
bfloat16 (the top 16 bits of the f32, rounded to nearest even; `bf16_encode`). The
`precision: bf16` mode uses it with `act_quant = {dtype: bf16}` on the consumer.

Activations (`act_quant`, an attribute of conv2d / matmul): the op's operand 0 is
quantized per tensor before the product, {scale, zero_point, dtype}: q = clip(rint(x *
(1/scale)) + zero_point) to u8 (0..255, asymmetric) or i8 (-127..127, symmetric,
zero_point 0), and the product sees (q - zero_point) * scale (`fake_quant`); or
{dtype: bf16}: x rounded to bfloat16 (nearest even), the product then exact in f32
and summed in f32 (`precision: bf16`, the AVX-512-BF16 `vdpbf16ps` arithmetic). Optional
`qmin` / `qmax` narrow or widen the code range within the dtype (a pre-quantized graph's
own range, e.g. i8 -128..127 with a zero point); `act_bounds` reads them. The backend
computes exactly that in integers (int32 accumulation) and rescales.

The backend consumes a `cuvil.dequantize` inside the conv2d/matmul kernel that uses it
(the weight is never materialised in f32), so the memory planner gives it no arena.
"""
from __future__ import annotations

import numpy as np

from ...errors import VerifyError
from ..core import Op
from ..types import TensorType

QK = 32                 # elements per int4 block
Q4_BLOCK_BYTES = 2 + QK // 2
SCHEMES = ("int4_block", "int8_channel", "bf16")
ACT_RANGES = {"u8": (0, 255), "i8": (-127, 127)}


def as_rows(w: np.ndarray, out_axis: int) -> np.ndarray:
    """The weight as [output channels, reduction] (a view or a copy)."""
    return np.moveaxis(w, out_axis, 0).reshape(w.shape[out_axis], -1)


def from_rows(rows: np.ndarray, shape, out_axis: int) -> np.ndarray:
    moved = [shape[out_axis]] + [d for i, d in enumerate(shape) if i != out_axis]
    return np.moveaxis(rows.reshape(moved), 0, out_axis)


def q4_blocks(length: int) -> int:
    return -(-length // QK)


def q4_encode(rows: np.ndarray) -> np.ndarray:
    """[R, L] f32 -> [R, ceil(L/32), 18] u8 (the Q4_0 layout above)."""
    r, length = rows.shape
    nb = q4_blocks(length)
    x = np.zeros((r, nb * QK), np.float32)
    x[:, :length] = rows
    x = x.reshape(r, nb, QK)
    pick = np.abs(x).argmax(axis=2)[..., None]
    d = np.take_along_axis(x, pick, axis=2)[..., 0] / -8.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    codes = np.clip(np.floor(x * inv[..., None] + 8.5), 0, 15).astype(np.uint8)
    out = np.empty((r, nb, Q4_BLOCK_BYTES), np.uint8)
    out[..., :2] = d.astype("<f2")[..., None].view(np.uint8)
    out[..., 2:] = codes[..., :QK // 2] | (codes[..., QK // 2:] << 4)
    return out


def q4_decode(q: np.ndarray, length: int) -> np.ndarray:
    """[R, nb, 18] u8 -> [R, length] f32."""
    d = np.ascontiguousarray(q[..., :2]).view("<f2")[..., 0].astype(np.float32)
    qs = q[..., 2:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float32) - 8.0
    x = codes * d[..., None]
    return x.reshape(q.shape[0], -1)[:, :length]


def bf16_round(x: np.ndarray) -> np.ndarray:
    """f32 values rounded to the nearest bfloat16 (ties to even), as f32; NaN stays NaN."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    out = bits.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out)


def bf16_encode(rows: np.ndarray) -> np.ndarray:
    """[R, L] f32 -> [R, 2L] u8: each value as little-endian bfloat16 (nearest even)."""
    top = (bf16_round(rows).view(np.uint32) >> 16).astype("<u2")
    return np.ascontiguousarray(top).view(np.uint8).reshape(rows.shape[0], -1)


def bf16_decode(q: np.ndarray) -> np.ndarray:
    """[R, 2L] u8 -> [R, L] f32 (exact)."""
    top = np.ascontiguousarray(q).view("<u2").astype(np.uint32)
    return (top << 16).view(np.float32)


def act_bounds(aq: dict) -> tuple[int, int]:
    """The code range (qmin, qmax) of the activation quantization aq."""
    lo, hi = ACT_RANGES[aq["dtype"]]
    return int(aq.get("qmin", lo)), int(aq.get("qmax", hi))


def rounds_to_bf16(post) -> bool:
    """Whether an epilogue program (`post`) ends rounding to bfloat16 (a last
    `fake_quant {dtype: bf16}` step, passes/quantize_bf16.rounds_result): its op's
    result holds bf16 values."""
    return bool(post) and post[-1][0] == "fake_quant" and post[-1][2] == {"dtype": "bf16"}


def fake_quant(x: np.ndarray, aq: dict) -> np.ndarray:
    """x quantized per tensor as `act_quant` aq says, and mapped back to f32."""
    if aq["dtype"] == "bf16":
        return bf16_round(x.astype(np.float32))
    lo, hi = act_bounds(aq)
    inv = np.float32(1.0 / aq["scale"])
    q = np.clip(np.rint(x.astype(np.float32) * inv) + np.float32(aq["zero_point"]), lo, hi)
    return ((q - aq["zero_point"]) * np.float64(aq["scale"])).astype(np.float32)


class Dequantize(Op):
    """attrs: scheme (SCHEMES), shape (the f32 weight's shape), out_axis. Operands: the
    u8 int4 blocks, the i8 codes and the f32 per-channel scales, or the u8 bf16 bytes."""

    name = "cuvil.dequantize"

    @classmethod
    def infer_types(cls, types, attrs):
        shape, axis, scheme = tuple(attrs["shape"]), attrs["out_axis"], attrs["scheme"]
        if scheme not in SCHEMES:
            raise VerifyError(f"cuvil.dequantize: unknown scheme {scheme!r}")
        if not 0 <= axis < len(shape):
            raise VerifyError(f"cuvil.dequantize: out_axis {axis} of a rank-{len(shape)} weight")
        rows = shape[axis]
        length = int(np.prod(shape)) // rows
        if scheme == "int4_block":
            want = [((rows, q4_blocks(length), Q4_BLOCK_BYTES), "u8")]
        elif scheme == "bf16":
            want = [((rows, 2 * length), "u8")]
        else:
            want = [((rows, length), "i8"), ((rows,), "f32")]
        got = [(tuple(t.shape), t.dtype) for t in types]
        if got != want:
            raise VerifyError(f"cuvil.dequantize: {scheme} data for {list(shape)} is "
                              f"{', '.join(f'{d}{list(s)}' for s, d in want)}, got {', '.join(map(str, types))}")
        return [TensorType(shape, "f32")]

    @classmethod
    def reference(cls, args, attrs):
        shape, axis = tuple(attrs["shape"]), attrs["out_axis"]
        length = int(np.prod(shape)) // shape[axis]
        if attrs["scheme"] == "int8_channel":
            rows = args[0].astype(np.float32) * args[1][:, None]
        elif attrs["scheme"] == "bf16":
            rows = bf16_decode(args[0])
        else:
            rows = q4_decode(args[0], length)
        return [from_rows(rows, shape, axis)]
