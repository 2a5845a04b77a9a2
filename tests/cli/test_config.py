"""Config validation: every error names the key and the file:line; templates are valid."""
from __future__ import annotations

import re

import pytest

from cuvil.cli import TEMPLATES, main
from cuvil.config import ConfigError, load_config

GOOD = """\
model:
  framework: pytorch
  module: examples.models.mlp
  entry: cuvil_entry
  python_path: [{root}]
inputs:
  - name: x
    shape: [1, 784]
    dtype: f32
outputs:
  - name: logits
"""


def _write(tmp_path, text, root):
    p = tmp_path / "config.yaml"
    p.write_text(text.replace("{root}", str(root)))
    return p


@pytest.fixture
def root():
    from pathlib import Path
    return Path(__file__).resolve().parents[2]


def test_good_config_loads(tmp_path, root):
    cfg = load_config(_write(tmp_path, GOOD, root))
    assert cfg.name == "mlp"
    assert cfg.data["inputs"][0]["shape"] == [1, 784]


@pytest.mark.parametrize("change, key, line, words", [
    (("    dtype: f32", "    dtyp: f32"), "inputs[0].dtyp", 9, "unknown key"),
    (("    dtype: f32", "    dtype: f31"), "inputs[0].dtype", 9, "f31"),
    (("    shape: [1, 784]", "    shape: [1, -784]"), "inputs[0].shape[1]", 8, "minimum"),
    (("    shape: [1, 784]", "    shape: one"), "inputs[0].shape", 8, "not of type 'array'"),
    (("  framework: pytorch", "  framework: caffe"), "model.framework", 2, "caffe"),
    (("outputs:", "target:\n  arch: riscv64-linux-gnu\noutputs:"), "target.arch", 11, "riscv64"),
    (("outputs:", "quantization:\n  method: int8_sym\noutputs:"), "quantization", 10, "int8_sym needs calibration"),
    (("outputs:", "quantization:\n  method: int3\noutputs:"), "quantization.method", 11, "int3"),
    (("outputs:", "quantization:\n  method: fp16\n  weight: {dtype: int4}\noutputs:"), "quantization.weight.dtype",
     12, "method int4_block"),
    (("outputs:", "quantization:\n  weight: {dtype: f16}\n  qat_mode: true\noutputs:"), "quantization.qat_mode",
     12, "does not combine with method fp16"),
    (("outputs:", "quantization:\n  weight: {dtype: int8}\n  calibration: {files: [nope/*.npy]}\noutputs:"),
     "quantization.calibration.files[0]", 12, "no file matches"),
    (("outputs:", "plugin:\n  modules: [a.c]\noutputs:"), "plugin.modules[0]", 11, "file not found"),
    (("outputs:", "optimise:\n  threads: 2\noutputs:"), "optimise", 10, "unknown key"),
    (("  module: examples.models.mlp", "  source: missing_model.py"), "model.source", 3, "file not found"),
])
def test_errors_name_key_and_line(tmp_path, root, change, key, line, words):
    path = _write(tmp_path, GOOD.replace(*change), root)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:{line}: {key}:"), msg
    assert words in msg


def test_missing_labels_file_names_the_key(tmp_path, root):
    text = GOOD + "    postprocess:\n      kind: classification\n      labels: nope.txt\n"
    path = _write(tmp_path, text, root)
    with pytest.raises(ConfigError, match=re.escape(f"{path}:14: outputs[0].postprocess.labels: file not found")):
        load_config(path)


def test_not_yaml_and_missing_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: not valid YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="the config file is a directory"):
        load_config(tmp_path)


@pytest.mark.parametrize("template", TEMPLATES)
def test_templates_are_valid_configs(tmp_path, template, capsys):
    out = tmp_path / "sub" / "config.yaml"
    out.parent.mkdir()
    assert main(["init", "--template", template, str(out)]) == 0
    text = out.read_text()
    assert text.lstrip().startswith("#")  # commented
    cfg = load_config(out)
    assert cfg.data["model"]["framework"] == "pytorch"
    # Refuses to overwrite without --force.
    assert main(["init", "--template", template, str(out)]) == 1
    assert "exists" in capsys.readouterr().err


def test_unknown_template_is_a_clear_error(tmp_path, capsys):
    assert main(["init", "--template", "nope", str(tmp_path / "c.yaml")]) == 1
    assert "unknown template 'nope'" in capsys.readouterr().err


def test_quantization_mapping_and_calibration_files(tmp_path, root):
    import numpy as np
    from cuvil.options import CalibrationFiles
    from cuvil.quant_config import quantization_from_config
    np.save(tmp_path / "a.npy", np.zeros((1, 784), np.float32))
    text = GOOD.replace("outputs:", "quantization:\n  weight: {dtype: int8, scheme: symmetric, granularity: per_channel}\n"
                        "  activation: {dtype: int8, scheme: symmetric}\n  keep_f32: 1\n"
                        "  calibration: {files: ['*.npy'], ranges: percentile, percentile: 99.9}\noutputs:")
    q = quantization_from_config(load_config(_write(tmp_path, text, root)))
    assert q.method == "int8_sym" and q.precision == "f32" and not q.qat
    assert q.activation == "i8" and q.keep_f32 == 1 and q.ranges == "percentile" and q.percentile == 99.9
    assert isinstance(q.calibration, CalibrationFiles) and q.calibration.generator is None
    assert [path for path, _ in q.calibration.files] == [str(tmp_path / "a.npy")]
