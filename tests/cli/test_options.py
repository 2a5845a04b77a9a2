"""options.py: one Quantization / CompileOptions type, the only lists of methods and
precisions, and every other place (CLI, config schema, Bazel rules) reading them."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from cuvil import cli, quant_config
from cuvil.backend.llvm.target import TARGET_NAMES, TARGET_TRIPLES
from cuvil.config import SCHEMA
from cuvil.errors import CuvilError
from cuvil.options import (PRECISIONS, QUANTIZATION_METHODS, RANGES, CalibrationFiles, CompileOptions, Quantization,
                           TargetSpec)

ROOT = Path(__file__).resolve().parents[2]


def _starlark(path: str, name: str):
    """The literal assigned to `name` at the top level of a .bzl file."""
    text = (ROOT / path).read_text()
    m = re.search(rf"^{name} = (\[[^\]]*\]|\{{[^}}]*\}})", text, re.M)
    assert m, f"{path}: no {name} = [...] / {{...}}"
    return ast.literal_eval(re.sub(r"#[^\n]*", "", m.group(1)))


def test_bazel_rules_allow_exactly_the_options_lists():
    assert _starlark("rules/private/model.bzl", "QUANTIZATIONS") == list(QUANTIZATION_METHODS)
    assert _starlark("rules/private/model.bzl", "PRECISIONS") == list(PRECISIONS)
    assert _starlark("rules/private/toolchain.bzl", "_TARGETS") == TARGET_TRIPLES


def _choices(command: str, option: str):
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command").choices[command]
    return next(a for a in sub._actions if option in a.option_strings).choices


def test_cli_and_config_schema_read_the_same_lists():
    assert list(_choices("compile", "--quantization")) == list(QUANTIZATION_METHODS)
    assert list(_choices("quant-report", "--quantization")) == [m for m in QUANTIZATION_METHODS if m != "none"]
    assert list(_choices("compile", "--precision")) == list(PRECISIONS)
    for command in ("build", "compile", "inspect"):
        assert list(_choices(command, "--target")) == list(TARGET_NAMES)
    props = SCHEMA["properties"]
    assert props["quantization"]["properties"]["method"]["enum"] == list(QUANTIZATION_METHODS)
    assert props["precision"]["enum"] == list(PRECISIONS)
    assert props["target"]["properties"]["arch"]["enum"] == list(TARGET_NAMES)
    ranges = props["quantization"]["properties"]["calibration"]["properties"]["ranges"]
    assert ranges["enum"] == list(RANGES)
    # the config's weight dtypes name methods of the list
    assert set(quant_config.WEIGHT_DTYPES.values()) == set(QUANTIZATION_METHODS) - {"none"}


def test_quantization_from_a_name_or_itself():
    q = Quantization("int8_sym", calibration=[np.zeros((1, 3), np.float32)], keep_f32=2)
    assert Quantization.of("fp16") == Quantization("fp16") and Quantization.of(q) is q
    assert Quantization.of(None) == Quantization() and Quantization().method == "none"
    # calibration as input tuples of arrays, whatever iterable it came as
    assert len(q.calibration) == 1 and isinstance(q.calibration[0], tuple) and q.calibration[0][0].shape == (1, 3)
    assert q.needs_calibration and q.has_calibration and q.weights_method == "int8_sym"
    qat = Quantization("int8_sym", qat=True)
    assert qat.weights_method == "none" and not qat.needs_calibration


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "int3"}, r"method 'int3' is not supported \(supported: none, fp16, int4_block, int8_sym\)"),
    ({"precision": "f16"}, "precision 'f16' is not supported"),
    ({"method": "fp16", "precision": "bf16"}, "does not combine with quantization 'fp16'"),
    ({"method": "int8_sym", "activation": "u4"}, "activation 'u4'"),
    ({"method": "int8_sym", "ranges": "max"}, "calibration ranges 'max'"),
    ({"method": "int8_sym", "percentile": 20}, "percentile"),
    ({"method": "int8_sym", "keep_f32": -1}, "keep_f32"),
    ({"method": "fp16", "qat": True}, "no calibration"),
    ({"method": "int8_sym", "qat": True, "calibration": [(np.zeros(2),)]}, "no calibration"),
    ({"method": "int8_sym", "calibration": 3}, "iterable of input tuples"),
])
def test_quantization_errors(kwargs, message):
    with pytest.raises(CuvilError, match=message):
        Quantization(**kwargs)
    with pytest.raises(CuvilError, match="method name"):
        Quantization.of(8)


def test_json_form_is_stable_and_tells_options_apart():
    files = CalibrationFiles((("/c/a.npy", "ab" * 32),), "pkg.calib:batches")
    opts = CompileOptions(name="m", output_names=["y"], target=TargetSpec("aarch64-linux-gnu", "", "+neon"),
                          quantization=Quantization("int8_sym", calibration=files, ranges="percentile"))
    text = opts.json()
    assert text == CompileOptions(name="m", output_names=("y",), target=TargetSpec("aarch64-linux-gnu", "", "+neon"),
                                  quantization=Quantization("int8_sym", calibration=files,
                                                            ranges="percentile")).json()
    data = opts.to_json()
    assert list(data) == sorted(data) and data["quantization"]["calibration"] == {
        "files": [{"path": "/c/a.npy", "sha256": "ab" * 32}], "generator": "pkg.calib:batches"}
    assert data["target"] == {"arch": "aarch64-linux-gnu", "cpu": "", "features": "+neon"}
    assert data["output_names"] == ["y"] and data["threads"] == 1 and data["fuse"] is True
    other_files = CalibrationFiles((("/c/a.npy", "cd" * 32),))
    changed = [opts.replace(threads=2), opts.replace(fuse=False), opts.replace(target=TargetSpec()),
               opts.replace(quantization=Quantization("int8_sym", calibration=files)),
               opts.replace(quantization=Quantization("int8_sym", calibration=other_files))]
    assert len({text, *(o.json() for o in changed)}) == 1 + len(changed)
    # arrays (the Python API's calibration) by content
    a = Quantization("int8_sym", calibration=[(np.ones(3, np.float32),)]).to_json()["calibration"]
    b = Quantization("int8_sym", calibration=[(np.ones(3, np.float32) * 2,)]).to_json()["calibration"]
    assert a["inputs"] == 1 and a != b


def test_threads_are_checked():
    with pytest.raises(CuvilError, match="threads must be a positive integer, got 0"):
        CompileOptions(threads=0)
