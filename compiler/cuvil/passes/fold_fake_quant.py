"""fold-fake-quant: a pre-quantized graph's quantize/dequantize pairs onto the int8 kernels.

A graph captured from PT2E (frontends/torch_quant.py) carries int8 weights as
`cuvil.dequantize {scheme = "int8_channel"}` of constants and activations as
`cuvil.fake_quant`. This pass, before constant folding:

1. moves a rank-2 transpose into the dequantize it reads (a linear's W^T: the same rows,
   out_axis 1 - axis), so a matmul reads the int8 weight directly;
2. gives every conv2d / matmul that reads an int8 weight (as operand 1, in the layout the
   int8 kernels take, see quantize_int8.int8_candidate) and a fake_quant activation (as
   operand 0) that fake_quant's parameters as `act_quant` and reads the fake_quant's
   input instead: the integer GEMM computes the same product in int32;
3. turns every other use of a dequantize into an f32 constant (the reference's own
   dequantized weight: a depthwise conv, a weight whose activation is not quantized).

Remaining fake_quants stay as elementwise ops (fused like any other), so the compiled
function computes what the quantized graph computes. With `required` (qat_mode), a
graph without int8 weights is an error, and so is an activation of another dtype than
`activation` (when given). The count lands in fn.attrs["quantization"].
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CuvilError
from ..ir import Module
from ..ir.ops.quant import Dequantize
from .quantize_int8 import int8_candidate
from .rewrite import ConstNames, add_constant, erase_if_dead, replace_op

AQ_KEYS = ("dtype", "scale", "zero_point", "qmin", "qmax")


def _int8_dequantize(v):
    d = v.defining_op
    return d if d is not None and d.name == "cuvil.dequantize" and d.attrs["scheme"] == "int8_channel" else None


@dataclass(frozen=True)
class FoldFakeQuant:
    required: bool = False
    activation: str = ""          # with required: the activation dtype the config expects (u8 / i8)
    name = "fold-fake-quant"

    def apply(self, module: Module) -> None:
        names = ConstNames(module)
        for fn in module.all_functions():
            found = [op for op in fn.body.ops if op.name == "cuvil.dequantize"
                     and op.attrs["scheme"] == "int8_channel"]
            if not found:
                if self.required:
                    raise CuvilError("qat_mode: the model has no int8 quantize/dequantize nodes (export a PT2E-"
                                     "quantized model: prepare_pt2e, calibrate or train, convert_pt2e, then "
                                     "torch.export), or quantize a float model with calibration instead")
                continue
            self._transposes(fn)
            int8_ops = self._activations(fn, self.activation if self.required else "")
            fallback = self._materialise(fn, names)
            fn.attrs["quantization"] = {"source": "graph", "int8_ops": int8_ops, "f32_weights": fallback}

    @staticmethod
    def _transposes(fn) -> None:
        for op in list(fn.body.ops):
            if op.name != "cuvil.transpose" or op.attrs["perm"] != [1, 0]:
                continue
            d = _int8_dequantize(op.operands[0])
            if d is None:
                continue
            shape = list(d.attrs["shape"])
            t = Dequantize(list(d.operands), {"scheme": "int8_channel", "shape": shape[::-1],
                                             "out_axis": 1 - d.attrs["out_axis"]}, loc=d.loc)
            fn.body.insert_before(op, t)
            replace_op(op, [t.result])
            erase_if_dead(d)

    @staticmethod
    def _activations(fn, expect: str) -> int:
        count = 0
        for op in list(fn.body.ops):
            if op.name not in ("cuvil.conv2d", "cuvil.matmul") or len(op.operands) < 2 or "act_quant" in op.attrs:
                continue
            d = _int8_dequantize(op.operands[1])
            fq = op.operands[0].defining_op
            if d is None or fq is None or fq.name != "cuvil.fake_quant" or op.operands[0].dtype != "f32":
                continue
            if int8_candidate(op) != d.attrs["out_axis"]:
                continue
            if expect and fq.attrs["dtype"] != expect:
                raise CuvilError(f"qat_mode: the config says activations are {expect}, the model quantizes the "
                                 f"input of {op.name} as {fq.attrs['dtype']}" + (f" ({op.loc})" if op.loc else ""))
            op.attrs["act_quant"] = {k: fq.attrs[k] for k in AQ_KEYS}
            op.set_operand(0, fq.operands[0])
            erase_if_dead(fq)
            count += 1
        return count

    @staticmethod
    def _materialise(fn, names: ConstNames) -> list:
        """Uses of int8 weights without an int8 kernel read an f32 copy; the names of those weights."""
        out = []
        for d in [op for op in fn.body.ops if op.name == "cuvil.dequantize"]:
            plain = [u for u in dict.fromkeys(d.result.uses) if "act_quant" not in u.attrs]
            if not plain:
                continue
            value = Dequantize.reference([o.defining_op.value for o in d.operands], d.attrs)[0]
            f32 = add_constant(fn.body, d, value, names.numbered("dequantized"), d.loc)
            for u in plain:
                for i, v in enumerate(u.operands):
                    if v is d.result:
                        u.set_operand(i, f32)
            out.append(d.loc or list(d.attrs["shape"]))
            erase_if_dead(d)
        return out
