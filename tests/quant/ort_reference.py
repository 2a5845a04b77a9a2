"""onnxruntime's static QDQ quantization of the same model, as the peer to beat: export
to ONNX (torch.onnx), quantize_static with per-channel int8 weights and u8 activations
calibrated (min/max) on the same calibration images, run with onnxruntime."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def export_onnx(model, example: torch.Tensor, path: Path) -> Path:
    torch.onnx.export(model, (example,), str(path), input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}}, opset_version=17, dynamo=False)
    return path


def quantize_qdq(fp32_path: Path, calibration: np.ndarray, out: Path) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"x": calibration[i:i + 1]} for i in range(len(calibration))])

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(fp32_path), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


def run_onnx(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]
