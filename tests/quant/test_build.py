"""`cuvil build` with quantization from the config: MobileNetV2 int8_sym calibrated on
photos named in `quantization.calibration.files` (pre-processed like the executable's
input), the mapping form of the section, the build log's weight bytes and kept ops."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import torch

from cuvil.build import build
from cuvil.config import load_config
from tests.cli.test_build import ROOT, _torchvision_style, run_exe

QUANT = """quantization:
  weight: {dtype: int8, scheme: symmetric, granularity: per_channel}
  activation: {dtype: uint8, scheme: asymmetric, granularity: per_tensor}
  keep_f32: 6
  calibration:
    files: [%s/examples/photos/*_centre.jpg]
plugin:"""


def _mobilenet_int8_config(tmp_path):
    """examples/mobilenet_v2.yaml with the QUANT section, paths made absolute, in tmp_path."""
    text = (ROOT / "examples" / "mobilenet_v2.yaml").read_text()
    head, rest = text.split("quantization:", 1)
    text = head + QUANT % ROOT + rest.split("plugin:", 1)[1]
    text = text.replace("python_path: [..]", f"python_path: [{ROOT}]").replace(
        "labels: ../examples/", f"labels: {ROOT}/examples/")
    (tmp_path / "config.yaml").write_text(text)


def test_mobilenet_int8_sym_build_from_the_config(tmp_path):
    _mobilenet_int8_config(tmp_path)
    lines = []
    exe = build(load_config(tmp_path / "config.yaml"), tmp_path / "mbv2_int8", cache_dir=tmp_path / "cache",
                log=lines.append)
    log = "\n".join(lines)
    assert "(int8_sym)" in log and "int8 ops: 30; kept in f32: #" in log, log
    manifest = json.loads(next((tmp_path / "cache").rglob("mobilenet_v2.json")).read_text())
    q = manifest["quantization"]
    assert q["method"] == "int8_sym" and q["int8_ops"] == 30 and len(q["kept_f32"]) == 6
    assert q["weight_bytes"] < 0.55 * q["weight_bytes_fp32"]
    out = tmp_path / "pred.json"
    proc = subprocess.run([str(exe), "--input", str(ROOT / "examples" / "cat.jpg"), "--output", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["top_k"][0]["index"] in range(281, 286)  # a cat
    from examples.models.mobilenet_v2 import pretrained_mobilenet_v2
    x = _torchvision_style(ROOT / "examples" / "cat.jpg")
    with torch.no_grad():
        ref = pretrained_mobilenet_v2()(torch.from_numpy(x)).numpy()[0]
    got = run_exe(exe, [x], tmp_path)[0]
    assert int(np.argmax(got)) == int(np.argmax(ref))
    assert 1e-4 < np.abs(got - ref).max() / np.abs(ref).max() < 0.2  # really int8, still close


def test_calibration_photos_keep_the_preprocess_a_target_override_drops(tmp_path):
    """An override that removes the input's preprocess for aarch64 (.npy inputs there):
    calibration photos still need decoding, so the compile options keep the base
    config's image preprocess for them, and the calibration inputs are the host's."""
    from cuvil.build import compile_options
    from cuvil.quant_config import calibration_inputs
    _mobilenet_int8_config(tmp_path)
    with open(tmp_path / "config.yaml", "a") as f:
        f.write("overrides:\n  - when: {target: aarch64-linux-gnu}\n    inputs: [{name: image, preprocess: null}]\n")
    host = compile_options(load_config(tmp_path / "config.yaml"))
    arm = compile_options(load_config(tmp_path / "config.yaml", target="aarch64-linux-gnu"))
    assert host.calibration_preprocess is None and host.preprocess["image"]["kind"] == "image"
    assert arm.preprocess == {} and arm.calibration_preprocess == host.preprocess

    class _Fn:  # what calibration_inputs reads of the model's function
        input_names = ["image"]
        args = [type("A", (), {"type": type("T", (), {"shape": (1, 3, 224, 224)})()})()]
    got = calibration_inputs(arm.quantization.calibration, _Fn, arm.calibration_preprocess)
    want = calibration_inputs(host.quantization.calibration, _Fn, host.preprocess)
    assert len(got) == len(want) == 16 and all(np.array_equal(a[0], b[0]) for a, b in zip(got, want))
