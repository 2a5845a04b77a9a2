"""The generated header's C API, from C programs the tests compile: the shared library
gives torch's numbers, metadata matches the manifest, run_with_scratch checks size and
alignment, and two models (both headers in one file, both archives) share one program."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from .helpers import close, compile_c, run_c

C_DIR = Path(__file__).parent / "c"


def _api_program(model, tmp_path: Path) -> Path:
    so = model.artifact("shared")
    p = model.prefix
    return compile_c([C_DIR / "api_test.c", so], tmp_path / f"api_{p}",
                     f"-DMODEL_HEADER=\"{p}.h\"", f"-DP(x)={p}_##x", f"-DPU(x)={p.upper()}_##x",
                     "-I", str(model.dir), f"-Wl,-rpath,{so.parent}")


def _check_model_through_so(model, tmp_path: Path, seed: int):
    exe = _api_program(model, tmp_path)
    inputs = model.random_inputs(seed)
    for i, a in enumerate(inputs):
        (tmp_path / f"in{i}.bin").write_bytes(a.tobytes())
    proc = run_c(exe, tmp_path)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ok"), proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    meta = [ln.split() for ln in lines if ln.split()[0] in ("input", "output")]
    expected = [[kind, t["name"], t["dtype"], str(len(t["shape"])), ",".join(map(str, t["shape"])),
                 str(int(np.prod(t["shape"])) * 4)]
                for kind in ("input", "output") for t in model.manifest[kind + "s"]]
    assert meta == expected
    assert f"arena {model.manifest['arena_size']}" in lines
    for j, (t, ref) in enumerate(zip(model.manifest["outputs"], model.reference(*inputs))):
        got = np.frombuffer((tmp_path / f"out{j}.bin").read_bytes(), np.float32).reshape(t["shape"])
        assert close(got, ref), (got, ref)
    return lines


def test_shared_library_from_c_matches_torch(cnn, tmp_path):
    lines = _check_model_through_so(cnn, tmp_path, seed=0)
    errors = [ln for ln in lines if ln.startswith(("error", "too_small", "misaligned"))]
    assert errors[0].startswith("error invalid argument | model tiny_cnn: outputs array is NULL")
    assert errors[1].startswith("too_small 3 model tiny_cnn: scratch holds") and "needs" in errors[1]
    assert errors[2].startswith("misaligned 4 model tiny_cnn: scratch at") and "64-byte aligned" in errors[2]


def test_shared_library_two_inputs_two_outputs(two, tmp_path):
    _check_model_through_so(two, tmp_path, seed=1)


def test_shared_library_exports_only_the_api(cnn):
    so = cnn.artifact("shared")
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1] for line in syms.splitlines() if line.strip()}
    for fn in ("create", "destroy", "run", "run_with_scratch", "set_threads", "input_count", "input_name",
               "input_shape", "input_rank", "input_dtype", "output_count", "output_name", "output_shape"):
        assert f"tiny_cnn_{fn}" in names
    assert {"cuvil_status_message", "cuvil_last_error", "cuvil_parallel_for"} <= names
    assert "tiny_cnn_weights" not in names and "cuvil_fail" not in names


def test_two_models_in_one_program(cnn, two, tmp_path):
    exe = compile_c([C_DIR / "two_models.c", cnn.artifact("static"), two.artifact("static")],
                    tmp_path / "two_models", "-pedantic", "-I", str(cnn.dir), "-I", str(two.dir))
    a_in, b_in = cnn.random_inputs(3), two.random_inputs(4)
    for tag, arrays in (("a", a_in), ("b", b_in)):
        for i, arr in enumerate(arrays):
            (tmp_path / f"{tag}_in{i}.bin").write_bytes(arr.tobytes())
    proc = run_c(exe, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == [cnn.manifest["inputs"][0]["name"], two.manifest["inputs"][1]["name"], "ok"]
    for tag, model, arrays in (("a", cnn, a_in), ("b", two, b_in)):
        for j, (t, ref) in enumerate(zip(model.manifest["outputs"], model.reference(*arrays))):
            got = np.frombuffer((tmp_path / f"{tag}_out{j}.bin").read_bytes(), np.float32).reshape(t["shape"])
            assert close(got, ref), (tag, j)
