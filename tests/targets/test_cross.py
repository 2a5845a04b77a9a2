"""Cross targets: `cuvil build --target` for aarch64 (NEON, run under qemu-aarch64) and
wasm32-wasi (SIMD128, run under Node's WASI) against the host build; named x86_64 CPUs;
MobileNetV2 (real weights) and the small BERT encoder on all three targets."""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from cuvil.build import build, compile_bundle, compile_options, link_compiled
from cuvil.cli import main
from cuvil.config import load_config
from cuvil.errors import CuvilError
from cuvil.options import TargetSpec

from .helpers import ALL, CROSS, ROOT, assert_close, available, disassemble, run, run_npy, tiny_project

RNG_INPUT = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny project and its host executable's output (the reference)."""
    d = tmp_path_factory.mktemp("tiny")
    cfg = tiny_project(d / "p")
    exe = build(load_config(cfg), d / "tiny-host", cache_dir=d / "cache", log=lambda s: None)
    return {"dir": d, "config": cfg, "cache": d / "cache", "ref": run_npy(exe, [RNG_INPUT], d, "host")}


@pytest.mark.parametrize("target", CROSS)
def test_cross_build_runs_and_matches_host(tiny, target, tmp_path):
    logs = []
    exe = build(load_config(tiny["config"], target=target), tmp_path / "tiny", cache_dir=tiny["cache"],
                log=logs.append)
    assert "cached" in logs[0] and "done" in logs[1], logs  # one capture serves every target
    got = run_npy(exe, [RNG_INPUT], tmp_path)
    assert_close(got, tiny["ref"])
    # the executable's checks and messages work there too
    bad = run(exe, "--input", tmp_path / "missing.npy", "--output", tmp_path / "o.npy", check=False)
    assert bad.returncode == 1 and "missing.npy" in bad.stderr and not (tmp_path / "o.npy").exists()


@pytest.mark.skipif(not available("aarch64-linux-gnu"), reason="aarch64 toolchain or qemu missing")
def test_aarch64_binary_is_aarch64_and_model_code_uses_neon(tiny, tmp_path):
    cfg = load_config(tiny["config"], target="aarch64-linux-gnu")
    exe = build(cfg, tmp_path / "tiny", cache_dir=tiny["cache"], log=lambda s: None)
    readelf = subprocess.run(["readelf", "-h", str(exe)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"Machine:\s+AArch64", readelf)
    if shutil.which("file"):
        assert "ARM aarch64" in subprocess.run(["file", str(exe)], capture_output=True, text=True).stdout
    out = tmp_path / "compiled"
    manifest = compile_bundle(tiny["cache"].glob("capture/*/model.cvir").__next__(), compile_options(cfg), out)
    assert manifest["target"]["triple"] == "aarch64-unknown-linux-gnu" and "+neon" in manifest["target"]["features"]
    asm = disassemble(out / "tiny.o")
    neon = re.findall(r"\b(fmla|fmul|fadd|fmax)\s+v\d+\.4s", asm)
    assert len(neon) >= 10, asm[:2000]


@pytest.mark.skipif(not available("wasm32-wasi"), reason="clang/wasm-ld/node missing")
def test_wasm_uses_simd128_when_enabled_and_not_when_disabled(tiny, tmp_path):
    cvir = next(tiny["cache"].glob("capture/*/model.cvir"))
    opts = compile_options(load_config(tiny["config"], target="wasm32-wasi"))
    counts = {}
    for features in ("+simd128", "-simd128"):
        opts = opts.replace(target=replace(opts.target, features=features))
        out = tmp_path / features
        compile_bundle(cvir, opts, out)
        counts[features] = len(re.findall(r"\bf32x4\.", disassemble(out / "tiny.o")))
        exe = link_compiled(out, "executable", tmp_path / f"tiny{features}.wasm")
        assert exe.read_bytes()[:4] == b"\0asm"
        assert_close(run_npy(exe, [RNG_INPUT], tmp_path, features), tiny["ref"])
    assert counts["+simd128"] >= 10 and counts["-simd128"] == 0, counts


@pytest.mark.parametrize("cpu, features, want, refuse", [
    ("x86-64-v3", "", "ymm", "zmm"),                       # AVX2 only, by CPU name
    ("", "+avx2,+fma", "ymm", "zmm"),                      # AVX2 only, by features
    ("skylake-avx512", "", "zmm", None),                   # AVX-512
])
def test_x86_64_named_cpu_picks_vector_width(tiny, tmp_path, cpu, features, want, refuse):
    host_flags = open("/proc/cpuinfo").read()
    if want == "zmm" and "avx512f" not in host_flags or "avx2" not in host_flags:
        pytest.skip("this machine cannot run the code")
    cvir = next(tiny["cache"].glob("capture/*/model.cvir"))
    opts = compile_options(load_config(tiny["config"], target="x86_64-linux-gnu"))
    opts = opts.replace(target=TargetSpec("x86_64-linux-gnu", cpu, features))
    compile_bundle(cvir, opts, tmp_path / "c")
    asm = disassemble(tmp_path / "c" / "tiny.o")
    assert want in asm and (refuse is None or refuse not in asm)
    exe = link_compiled(tmp_path / "c", "executable", tmp_path / "tiny")
    assert_close(run_npy(exe, [RNG_INPUT], tmp_path), tiny["ref"])


def test_unknown_cpu_without_features_and_unsupported_kinds_are_clear_errors(tiny, tmp_path):
    cfg = load_config(tiny["config"])
    opts = compile_options(cfg)
    opts = opts.replace(target=TargetSpec("x86_64-linux-gnu", "pentium-pro-max", ""))
    with pytest.raises(CuvilError, match="give target.features too"):
        compile_bundle(next(tiny["cache"].glob("capture/*/model.cvir")), opts, tmp_path / "c")
    with pytest.raises(CuvilError, match="does not build shared libraries"):
        build(load_config(tiny["config"], target="wasm32-wasi"), tmp_path / "x.so", kind="shared",
              cache_dir=tiny["cache"], log=lambda s: None)


def test_cli_build_target_and_run(tiny, tmp_path, capsys):
    target = "aarch64-linux-gnu" if available("aarch64-linux-gnu") else "host"
    out = tmp_path / "tiny"
    assert main(["build", "--config", str(tiny["config"]), "--output", str(out), "--target", target,
                 "--cache-dir", str(tiny["cache"])]) == 0
    np.save(tmp_path / "x.npy", RNG_INPUT)
    proc = subprocess.run([str(ROOT / ".venv/bin/cuvil"), "run", str(out), "--input", str(tmp_path / "x.npy"),
                           "--output", str(tmp_path / "y.npy")], capture_output=True, text=True)
    if proc.returncode == 127 or "No such file" in proc.stderr:
        pytest.skip("no cuvil console script in .venv")
    assert proc.returncode == 0, proc.stderr
    assert_close(np.load(tmp_path / "y.npy"), tiny["ref"])


# -- the example models, all three targets ------------------------------------------------------
MOBILENET_YAML = f'''\
model:
  framework: pytorch
  name: mobilenet_v2
  module: examples.models.mobilenet_v2
  entry: cuvil_entry
  python_path: ["{ROOT}"]
inputs:
  - name: image
    shape: [1, 3, 224, 224]
    dtype: f32
    preprocess: {{kind: image, resize: 256, crop: 224, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}}
outputs:
  - name: logits
'''


def _three_targets(tmp_path, config, inputs):
    """Build `config` for every target this machine runs; outputs relative to the host's."""
    outs, errors = {}, {}
    for target in ("host", "aarch64-linux-gnu", "wasm32-wasi"):
        if not available(target):
            continue
        exe = build(load_config(config, target=target), tmp_path / f"model-{target}", cache_dir=tmp_path / "cache",
                    log=lambda s: None)
        outs[target] = run_npy(exe, inputs, tmp_path, target)
    for target, got in outs.items():
        errors[target] = assert_close(got, outs["host"])
    return errors


def test_mobilenet_v2_real_weights_on_three_targets(tmp_path):
    pytest.importorskip("examples.models.mobilenet_v2").pretrained_weights_path()
    config = tmp_path / "mobilenet_v2.yaml"
    config.write_text(MOBILENET_YAML)
    from examples.models.mobilenet_v2 import example_inputs
    errors = _three_targets(tmp_path, config, [example_inputs(3)[0].numpy()])
    assert len(errors) == sum(available(t) for t in ("host", "aarch64-linux-gnu", "wasm32-wasi"))


def test_bert_encoder_on_three_targets(tmp_path):
    config = tmp_path / "bert.yaml"
    config.write_text((ROOT / "compiler/cuvil/templates/pytorch-bert.yaml").read_text().replace("{root}", str(ROOT)))
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 1000, (1, 64)).astype(np.int64)
    mask = np.ones((1, 64), np.int64)
    mask[0, 40:] = 0
    _three_targets(tmp_path, config, [ids, mask])


INT8_YAML = '''\
quantization:
  method: int8_sym
  calibration:
    files: [calib/*.npy]
overrides:
  - when: {target: aarch64-linux-gnu}
    target: {features: "%s"}
'''


@pytest.mark.skipif(not available("aarch64-linux-gnu"), reason="aarch64 toolchain or qemu missing")
@pytest.mark.parametrize("features, dot", [("+neon,+dotprod", "sdot"), ("+neon", None)])
def test_int8_on_aarch64_matches_host(tmp_path, features, dot):
    """int8_sym on aarch64 with the dot-product extension (sdot, signed activation
    codes) and without it (plain NEON): the same integers as the host's int8 kernels."""
    cfg_path = tiny_project(tmp_path / "p", INT8_YAML % features)
    (tmp_path / "p" / "calib").mkdir()
    rng = np.random.default_rng(11)
    for i in range(4):
        np.save(tmp_path / "p" / "calib" / f"c{i}.npy", rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    cache = tmp_path / "cache"
    host = build(load_config(cfg_path), tmp_path / "host", cache_dir=cache, log=lambda s: None)
    cfg = load_config(cfg_path, target="aarch64-linux-gnu")
    a64 = build(cfg, tmp_path / "a64", cache_dir=cache, log=lambda s: None)
    ref = run_npy(host, [RNG_INPUT], tmp_path, "host")
    assert_close(run_npy(a64, [RNG_INPUT], tmp_path, "a64"), ref)
    out = tmp_path / "compiled"
    manifest = compile_bundle(next(cache.glob("capture/*/model.cvir")), compile_options(cfg), out)
    assert manifest["quantization"]["int8_ops"] == 2 and manifest["target"]["features"] == features
    asm = disassemble(out / "tiny.o", "--mattr=+dotprod")
    sdots = re.findall(r"\bsdot\s+v\d+\.4s", asm)
    assert (len(sdots) >= 4) if dot else not sdots, sdots[:4]
