"""quantize-weights: store conv2d / matmul weights in a narrower type.

`fp16`: every f32 constant used as a conv2d weight (operand 1) or a matmul B operand
(operand 1) is replaced by an f16 copy; the kernels widen it to f32 as they load it and
accumulate in f32. Weight bytes halve; results move by about fp16's rounding of the
weights (relative 2^-11 per weight). `int4_block`: the weights the int4 GEMM kernels
can read become 4-bit blocks (quantize_int4.py; with `calibration`, matmul codes are
chosen GPTQ-style), the others fp16. `int8_sym`: integer
conv2d/matmul with per-channel int8 weights and per-tensor activations calibrated on
`calibration` (a sequence of input tuples; quantize_int8.py); other weights stay f32.
`none` leaves the module as it is.

`precision = "bf16"` (with method `none`): conv2d / matmul compute in bfloat16 with f32
accumulation, weights stored as bf16 (quantize_bf16.py). `f32` (the default) changes
nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CuvilError
from ..ir import Module
from ..ir.ops.shape import Constant
from ..options import PRECISIONS
from ..options import QUANTIZATION_METHODS as METHODS
from .quantize_int4 import int4_layout, int4_weight
from .quantize_bf16 import bf16_rewrite
from .quantize_int8 import int8_rewrite
from .calibrate import input_grams


@dataclass(frozen=True)
class QuantizeWeights:
    method: str = "none"
    calibration: tuple = ()       # int8_sym: input tuples (or any iterable of them)
    activation: str = "u8"        # int8_sym: u8 asymmetric or i8 symmetric activations
    ranges: str = "minmax"        # int8_sym: minmax or percentile (calibrate.py)
    percentile: float = 99.99
    keep_f32: int = 0             # int8_sym: this many most sensitive ops stay f32
    report: bool = False          # int8_sym: list every candidate's scales and error (quant-report)
    precision: str = "f32"        # bf16: conv2d/matmul in bfloat16, f32 accumulation (method none only)
    name: str = "quantize-weights"

    def apply(self, module: Module) -> None:
        if self.method not in METHODS:
            raise CuvilError(f"quantization method {self.method!r} is not implemented "
                             f"(implemented: {', '.join(METHODS)})")
        if self.precision not in PRECISIONS:
            raise CuvilError(f"precision {self.precision!r} is not supported (supported: {', '.join(PRECISIONS)})")
        if self.precision == "bf16":
            if self.method != "none":
                raise CuvilError(f"precision bf16 computes in bfloat16 with its own bf16 weights; it does not "
                                 f"combine with quantization {self.method!r} (use one or the other)")
            module.main.attrs["precision"] = {"bf16_ops": bf16_rewrite(module.main)}
            return
        if self.method == "none":
            return
        fn = module.main
        if self.method == "int8_sym":
            fn.attrs["quantization"] = int8_rewrite(fn, self.calibration, self.activation, self.ranges,
                                                    self.percentile, self.keep_f32, self.report)
            return
        grams = self._int4_grams(fn) if self.method == "int4_block" and self.calibration else {}
        for region in module.all_functions():  # loop bodies and branches: weights alone (no calibration)
            self._weights_only(region, grams if region is fn else {})

    def _weights_only(self, fn, grams: dict) -> None:
        """fp16 / int4_block: the f32 weights of fn's conv2d and matmul ops converted."""
        converted: dict[tuple, object] = {}  # (id(f32 weight), int4 out_axis or None) -> its copy
        originals = []
        for op in list(fn.body.ops):
            if op.name not in ("cuvil.conv2d", "cuvil.matmul") or len(op.operands) < 2:
                continue
            w = op.operands[1]
            c = w.defining_op
            if c is None or c.name != "cuvil.constant" or w.dtype != "f32":
                continue
            if op.operands[0].dtype != "f32":
                continue
            axis = int4_layout(op) if self.method == "int4_block" else None
            key = (id(w), axis) if id(op) not in grams else (id(op), axis)  # GPTQ fits each use
            if key not in converted:
                if axis is None:
                    half = Constant(c.value.astype(np.float16), f"{c.attrs['name']}.f16", c.loc)
                    fn.body.insert_before(c, half)
                    converted[key] = half.result
                else:
                    converted[key] = int4_weight(fn, c, axis, grams.get(id(op)))
                originals.append(w)
            op.set_operand(1, converted[key])
        for w in dict.fromkeys(originals):  # the f32 originals no other op uses any more
            if not w.uses:
                fn.body.erase(w.defining_op)


    def _int4_grams(self, fn) -> dict:
        """int4_block with calibration: the input gram matrix of every int4 matmul."""
        ops = [op for op in fn.body.ops if op.name == "cuvil.matmul" and len(op.operands) > 1
               and op.operands[1].defining_op is not None and op.operands[1].defining_op.name == "cuvil.constant"
               and op.operands[1].dtype == "f32" and int4_layout(op) is not None]
        return input_grams(fn, self.calibration, ops)


def weight_bytes(module: Module) -> int:
    """Bytes of all constants (the weights the artifact embeds)."""
    return sum(int(op.value.nbytes) for op in module.main.body.ops if op.name == "cuvil.constant")
