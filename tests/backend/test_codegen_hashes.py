"""The generated code of the benchmark models, pinned by hash.

For ResNet-50, MobileNetV2, BERT-base, a MiniLM-shaped encoder and the MLP (the
benchmark's models, `benchmarks/bench_models.py`), in every precision and quantization
mode, for four fixed targets (never `host`, whose features differ between machines),
the LLVM IR text and the weight blob that code generation produces are hashed and
compared with `codegen_hashes.json`. A change that moves code generation, on purpose or
not, shows here; when it is on purpose, record the new hashes and say why in the commit:

    .venv/bin/python -m tests.backend.test_codegen_hashes [MODEL ...]

The compile path is the one `cuvil build` takes after capture: the pass pipeline for the
mode and target, then `generate`. Each model is captured once per test module.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

HASHES = Path(__file__).with_name("codegen_hashes.json")
MODELS = ("resnet50", "mobilenetv2", "bert-base", "minilm", "mlp")
MODES = ("f32", "bf16", "int8_sym", "int4_block", "fp16")

_AVX2 = "+avx,+avx2,+fma,+f16c,+bmi,+bmi2"
# (triple, cpu, features): named explicitly, so the same on every machine
TARGETS = {
    "avx512": ("x86_64-unknown-linux-gnu", "sapphirerapids",
               _AVX2 + ",+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512cd,-prefer-256-bit,+avx512vnni,+avx512bf16"),
    "avx2": ("x86_64-unknown-linux-gnu", "haswell", _AVX2),
    "aarch64": ("aarch64-unknown-linux-gnu", "generic", "+neon,+dotprod"),
    "wasm32": ("wasm32-unknown-wasi", "generic", "+simd128"),
}


def _capture(model_key: str, path: Path) -> tuple:
    """Capture the benchmark model to a bundle at path; its example inputs as arrays."""
    from benchmarks.bench_models import build
    from cuvil.api import _to_ir
    from cuvil.ir import write_bundle

    model, inputs, _ = build(model_key)
    write_bundle(_to_ir(model, inputs), path)
    return tuple(np.asarray(x) for x in inputs)


def _generate(bundle: Path, inputs: tuple, mode: str, target_key: str):
    """The generated code for one (mode, target): (IR hash, weights hash)."""
    from cuvil.backend.llvm.codegen import generate
    from cuvil.backend.llvm.select import KernelTarget, kernel_passes
    from cuvil.backend.llvm.target import Target
    from cuvil.ir import read_bundle
    from cuvil.passes.pipeline import default_pipeline, run_pipeline

    target = Target(*TARGETS[target_key])
    module = read_bundle(bundle)
    quant = {"method": "none", "precision": "f32"}
    if mode == "bf16":
        quant["precision"] = "bf16"
    elif mode != "f32":
        quant["method"] = mode
    if mode == "int8_sym":
        quant["calibration"] = (inputs,)
    run_pipeline(module, default_pipeline(**kernel_passes(KernelTarget.of(target)), quantize_weights=quant))
    gen = generate(module, "model")
    return (hashlib.sha256(gen.llvm_ir.encode()).hexdigest()[:16],
            hashlib.sha256(gen.weights).hexdigest()[:16])


def _model_hashes(model_key: str, tmp: Path) -> dict:
    bundle = tmp / f"{model_key}.cvir"
    inputs = _capture(model_key, bundle)
    return {f"{mode}/{target}": list(_generate(bundle, inputs, mode, target))
            for mode in MODES for target in TARGETS}


# The models are checked in two files so that pytest-xdist's workers share them
# (test_codegen_hashes_more.py checks the others).
HERE = ("resnet50", "minilm", "mlp")


@pytest.mark.parametrize("model_key", HERE)
def test_generated_code_is_unchanged(model_key, tmp_path):
    check_model(model_key, tmp_path)


def check_model(model_key: str, tmp_path: Path) -> None:
    """The model's hashes now against the recorded ones."""
    recorded = json.loads(HASHES.read_text())[model_key]
    got = _model_hashes(model_key, tmp_path)
    moved = {k: (recorded.get(k), v) for k, v in got.items() if recorded.get(k) != v}
    assert not moved, (f"{model_key}: generated code moved for {sorted(moved)} (recorded, now: "
                       f"{moved}); if on purpose, re-record with `python -m tests.backend.test_codegen_hashes "
                       f"{model_key}`")


def _record(models) -> None:
    import tempfile
    table = json.loads(HASHES.read_text()) if HASHES.exists() else {}
    for key in models:
        with tempfile.TemporaryDirectory() as tmp:
            table[key] = _model_hashes(key, Path(tmp))
        print(key, "recorded", flush=True)
    HASHES.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(root), str(root / "compiler")]
    _record(sys.argv[1:] or MODELS)
