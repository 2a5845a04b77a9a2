"""Pre-quantized PyTorch graphs: the `quantized_decomposed` ops that PT2E quantization
(`prepare_pt2e` / `convert_pt2e`, then `torch.export`) leaves in a graph.

- `quantize_per_tensor` then `dequantize_per_tensor` of an activation (the same
  parameters) becomes one `cuvil.fake_quant {dtype, scale, zero_point, qmin, qmax}`:
  f32 in, f32 out, the value rounded to the quantization grid (ir/ops/quant.fake_quant).
  A quantized tensor used by anything other than its dequantize is refused.
- `dequantize_per_channel` / `dequantize_per_tensor` of an int8 weight constant with
  zero points 0 becomes `cuvil.dequantize {scheme = "int8_channel", out_axis}` of the
  codes and the scales (a per-tensor scale is repeated per row); the fold-fake-quant pass
  then hands conv2d / matmul the int8 weight and the activation's fake_quant as
  `act_quant`. Other dequantizes (asymmetric weights, other integer inputs) are lowered
  as (float(q) - zero_point) * scale, the float computation torch's reference does.
- `quantize_per_channel` of a float constant is evaluated here (torch's rounding).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from ..ir.ops.quant import as_rows
from .torch_ops import handles

_CODE_DTYPES = {"uint8": "u8", "int8": "i8"}


@dataclass(frozen=True)
class Quantized:
    """The result of quantize_per_tensor: x's codes are never materialised; only its
    dequantize (a fake_quant of x) may read it."""
    x: Value
    aq: tuple  # sorted act_quant items


def _code_dtype(dtype) -> str:
    key = str(dtype).replace("torch.", "")
    if key not in _CODE_DTYPES:
        raise UnsupportedOpError(f"quantization to {key} is not supported (uint8 and int8 are)")
    return _CODE_DTYPES[key]


def _scalar(v, what: str) -> float:
    if isinstance(v, Value):
        op = v.defining_op
        if op is None or op.name != "cuvil.constant" or op.value.size != 1:
            raise UnsupportedOpError(f"{what} must be a constant scalar (dynamic quantization is not supported)")
        return float(op.value.reshape(()))
    return float(v)


def _array(v, what: str) -> np.ndarray:
    op = v.defining_op if isinstance(v, Value) else None
    if op is None or op.name != "cuvil.constant":
        raise UnsupportedOpError(f"{what} must be a constant")
    return op.value


def _act_quant(a) -> dict:
    scale = float(np.float32(_scalar(a["scale"], "the quantization scale")))
    if not scale > 0:
        raise UnsupportedOpError(f"quantization scale {scale} is not positive")
    return {"dtype": _code_dtype(a["dtype"]), "scale": scale,
            "zero_point": int(_scalar(a["zero_point"], "the zero point")),
            "qmin": int(a["quant_min"]), "qmax": int(a["quant_max"])}


def _check_out_dtype(a) -> None:
    out = a.get("out_dtype")
    if out is not None and str(out) != "torch.float32":
        raise UnsupportedOpError(f"dequantize to {out} is not supported (float32 is)")


@handles("quantized_decomposed::quantize_per_tensor")
def _quantize_per_tensor(low, a):
    x = a["input"]
    if not isinstance(x, Value) or x.dtype != "f32":
        raise UnsupportedOpError("quantize_per_tensor of a non-float32 tensor is not supported")
    return Quantized(x, tuple(sorted(_act_quant(a).items())))


@handles("quantized_decomposed::quantize_per_channel")
def _quantize_per_channel(low, a):
    w = _array(a["input"], "the input of quantize_per_channel (a weight)").astype(np.float32)
    scales = _array(a["scales"], "per-channel scales").astype(np.float32)
    zps = _array(a["zero_points"], "per-channel zero points").astype(np.float32)
    axis = int(a["axis"]) % w.ndim
    shape = [1] * w.ndim
    shape[axis] = -1
    inv = np.float32(1.0) / scales.reshape(shape)
    q = np.clip(np.rint(w * inv) + zps.reshape(shape), a["quant_min"], a["quant_max"])
    dtype = _code_dtype(a["dtype"])
    return low.const(q, dtype)


def _float_dequantize(low, q: Value, scale: np.ndarray, zp: np.ndarray, axis: int | None) -> Value:
    """(float(q) - zp) * scale, scale and zp scalars or per-channel along axis."""
    shape = [1] * q.type.rank
    if axis is not None:
        shape[axis] = -1
    s = low.const(np.asarray(scale, np.float32).reshape(shape if axis is not None else ()), "f32")
    z = low.const(np.asarray(zp, np.float32).reshape(shape if axis is not None else ()), "f32")
    return low.op("cuvil.mul", low.op("cuvil.sub", low.cast(q, "f32"), z), s)


def _int8_weight(low, q: Value, scales: np.ndarray, axis: int) -> Value:
    codes = _array(q, "an int8 weight")
    codes_v = low.const(np.ascontiguousarray(as_rows(codes, axis)), "i8")
    scale_v = low.const(np.asarray(scales, np.float32), "f32")
    return low.b.op("cuvil.dequantize", codes_v, scale_v, scheme="int8_channel", shape=list(codes.shape),
                    out_axis=axis)


def _weight_like(q) -> bool:
    return (isinstance(q, Value) and q.dtype == "i8" and q.type.rank >= 2 and q.type.is_static
            and q.defining_op is not None and q.defining_op.name == "cuvil.constant")


@handles("quantized_decomposed::dequantize_per_tensor")
def _dequantize_per_tensor(low, a):
    _check_out_dtype(a)
    q = a["input"]
    if isinstance(q, Quantized):
        aq = _act_quant(a)
        if tuple(sorted(aq.items())) != q.aq:
            raise UnsupportedOpError(f"dequantize_per_tensor with parameters {aq} of a tensor quantized with "
                                     f"{dict(q.aq)} is not supported")
        return low.op("cuvil.fake_quant", q.x, **aq)
    scale = np.float32(_scalar(a["scale"], "the dequantization scale"))
    zp = int(_scalar(a["zero_point"], "the zero point"))
    if _weight_like(q) and zp == 0:
        return _int8_weight(low, q, np.full(q.shape[0], scale, np.float32), 0)
    return _float_dequantize(low, q, scale, zp, None)


@handles("quantized_decomposed::dequantize_per_channel")
def _dequantize_per_channel(low, a):
    _check_out_dtype(a)
    q = a["input"]
    if isinstance(q, Quantized) or not isinstance(q, Value):
        raise UnsupportedOpError("dequantize_per_channel reads a quantized constant weight")
    axis = int(a["axis"]) % q.type.rank
    scales = _array(a["scales"], "per-channel scales").astype(np.float32)
    zp = a["zero_points"]
    zps = np.zeros_like(scales) if zp is None else _array(zp, "per-channel zero points")
    if _weight_like(q) and not np.any(zps):
        return _int8_weight(low, q, scales, axis)
    return _float_dequantize(low, q, scales, zps, axis)


def check_operands(key: str, args: dict) -> None:
    """A quantized tensor may only be read by its dequantize."""
    if key.startswith("quantized_decomposed::dequantize"):
        return
    for v in args.values():
        for item in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(item, Quantized):
                raise UnsupportedOpError(f"{key} reads the integer result of quantize_per_tensor (only its "
                                         "dequantize_per_tensor may)")
