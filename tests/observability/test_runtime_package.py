"""The cuvil-runtime wheel in a fresh venv that holds only NumPy and the wheel: it loads
built shared libraries (static shapes and a symbolic batch), runs them from 4 Python
threads with a context each, matches the executables built from the same objects, and
refuses bad inputs with a Python exception that names the input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from cuvil import api
from cuvil.backend.llvm.codegen import generate
from cuvil.backend.llvm.target import compile_to_object, host_target
from cuvil.backend.llvm.weights import weights_object
from cuvil.build import make_manifest, signature_ir
from cuvil.native import link_artifact
from cuvil.options import CompileOptions
from cuvil.passes.pipeline import optimise

ROOT = Path(__file__).resolve().parents[2]
BOUNDS = {"b": (1, 8)}

# Runs inside the fresh venv: argv[1] is the job (JSON), the results go to argv[2].
VENV_SCRIPT = r'''
import importlib.util, json, os, sys, threading
import numpy as np
import cuvil_runtime

job = json.load(open(sys.argv[1]))


def renamed(path, new):  # in_<model>_<k>.npy -> <new>_<model>_<k>.npy
    return os.path.join(os.path.dirname(path), new + os.path.basename(path)[2:])

res = {"foreign": [m for m in ("torch", "cuvil", "llvmlite") if importlib.util.find_spec(m)], "models": {}}
for name, spec in job["models"].items():
    model = cuvil_runtime.load(spec["so"])
    info = {"name": model.name, "dims": model.dims, "repr": repr(model),
            "inputs": [[t.name, str(t.dtype), list(t.shape)] for t in model.inputs],
            "outputs": [[t.name, str(t.dtype), list(t.shape)] for t in model.outputs]}
    errors, seen = [], []
    barrier = threading.Barrier(4)

    def worker(k):
        try:
            with model.context(threads=1 + k % 2) as ctx:
                seen.append(id(ctx))
                barrier.wait()
                for rep in range(3):
                    for path in spec["inputs"][k::4]:
                        (y,) = ctx.run(np.load(path))
                        np.save(renamed(path, f"py{rep}"), y)
        except BaseException as e:  # reported, not swallowed
            errors.append(repr(e))
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    info["thread_errors"], info["contexts"] = errors, len(set(seen))
    (pooled,) = model(**{model.inputs[0].name: np.load(spec["inputs"][0])})  # the pool, by name
    np.save(renamed(spec["inputs"][0], "pool"), pooled)
    bad = []
    for label, make in spec["bad"].items():
        try:
            model(*[eval(expr, {"np": np}) for expr in make])
            bad.append([label, None, None, None])
        except Exception as e:
            bad.append([label, type(e).__name__, str(e), getattr(e, "input", None)])
    info["bad"] = bad
    res["models"][name] = info
try:
    cuvil_runtime.load(job["not_a_model"])
except cuvil_runtime.CuvilRuntimeError as e:
    res["not_a_model"] = str(e)
json.dump(res, open(sys.argv[2], "w"))
'''


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.relu(self.fc1(x))), dim=-1)


class NonZero(nn.Module):
    """An output of a data-dependent size: the indices of the elements above 0.5."""

    def forward(self, x):
        return torch.nonzero(x > 0.5)


def _build(tmp: Path, prefix: str, model: nn.Module, example, dynamic=None) -> dict:
    """The shared library and the executable of `model`, linked from the same objects."""
    ir = api._to_ir(model, (example,), dynamic, BOUNDS if dynamic else None)
    target = host_target()
    optimise(ir, CompileOptions(name=prefix), target)
    gen = generate(ir, prefix)
    objects = [tmp / f"{prefix}.o", tmp / f"{prefix}.weights.o"]
    objects[0].write_bytes(compile_to_object(gen.llvm_ir + signature_ir(prefix, target.triple), target))
    objects[1].write_bytes(weights_object(f"{prefix}_weights", gen.weights, target))
    manifest = make_manifest(gen, target)
    so = link_artifact("shared", objects, manifest, None, tmp / f"lib{prefix}.so")
    exe = link_artifact("exe", objects, manifest, None, tmp / prefix)
    return {"so": str(so), "exe": str(exe)}


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    """A fresh venv (no system site packages) with only the wheel and NumPy installed."""
    tmp = tmp_path_factory.mktemp("cuvil_runtime_venv")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    str(ROOT / "runtime-python"), "-w", str(tmp / "wheel")], check=True, timeout=300)
    wheel = next((tmp / "wheel").glob("cuvil_runtime-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=300)
    py = tmp / "venv" / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=600)
    return py


def test_wheel_in_fresh_venv_runs_built_libraries_from_threads(tmp_path, venv_python):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    # name -> (module, symbolic dims, input shapes, the output's descriptor: dtype, shape at the bounds)
    models = {"static": (Mlp().eval(), None, [(2, 16)] * 8, ("float32", [2, 4])),
              "batch": (Mlp().eval(), [("b", 16)], [(b, 16) for b in (1, 3, 8, 5, 2, 7, 4, 6)], ("float32", [8, 4])),
              "nonzero": (NonZero(), None, [(2, 16)] * 8, ("int64", [32, 2]))}
    job = {"models": {}, "not_a_model": str(venv_python)}
    for name, (module, dynamic, shapes, _) in models.items():
        art = _build(tmp_path, f"rt_{name}", module, torch.randn(2, 16), dynamic)
        paths = []
        for k, shape in enumerate(shapes):
            path = tmp_path / f"in_{name}_{k}.npy"
            np.save(path, rng.standard_normal(shape).astype(np.float32))
            subprocess.run([art["exe"], "--input", str(path), "--output", str(tmp_path / f"exe_{name}_{k}.npy")],
                           check=True, timeout=60, capture_output=True)
            paths.append(str(path))
        bad = {"rank": ["np.zeros((16,), np.float32)"], "dtype": ["np.zeros((2, 16), np.complex64)"],
               "count": ["np.zeros((2, 16), np.float32)", "np.zeros((2, 16), np.float32)"],
               "fixed_dim": ["np.zeros((2, 15), np.float32)"]}
        if dynamic:
            bad["bounds"] = ["np.zeros((9, 16), np.float32)"]
        job["models"][name] = {"so": art["so"], "inputs": paths, "bad": bad}
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "run.py").write_text(VENV_SCRIPT)
    proc = subprocess.run([str(venv_python), str(tmp_path / "run.py"), str(tmp_path / "job.json"),
                           str(tmp_path / "res.json")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads((tmp_path / "res.json").read_text())
    assert res["foreign"] == []  # neither the compiler nor torch is reachable from that venv
    assert "no Cuvil model signature" in res["not_a_model"]

    sizes = set()
    for name, (module, dynamic, shapes, (out_dtype, out_shape)) in models.items():
        info = res["models"][name]
        assert info["name"] == f"rt_{name}" and info["thread_errors"] == [] and info["contexts"] == 4
        assert info["inputs"] == [["x", "float32", ["b" if dynamic else 2, 16]]]
        assert info["outputs"] == [[info["outputs"][0][0], out_dtype, out_shape]]
        assert info["dims"] == ({"b": [1, 8]} if dynamic else {"nonzero": [0, 32]} if name == "nonzero" else {})
        for k, shape in enumerate(shapes):
            path = tmp_path / f"in_{name}_{k}.npy"
            exe_out = np.load(tmp_path / f"exe_{name}_{k}.npy")
            with torch.no_grad():
                ref = module(torch.from_numpy(np.load(path))).numpy()
            assert exe_out.shape == ref.shape
            np.testing.assert_allclose(exe_out, ref, rtol=1e-5, atol=1e-6)
            sizes.add((name, ref.shape))
            for rep in range(3):
                got = np.load(tmp_path / f"py{rep}_{name}_{k}.npy")
                assert got.dtype == np.dtype(out_dtype) and got.shape == exe_out.shape  # nonzero: cut to the run's size
                np.testing.assert_allclose(got, exe_out, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.load(str(tmp_path / f"pool_{name}_0.npy")),
                                   np.load(str(tmp_path / f"exe_{name}_0.npy")), rtol=1e-6, atol=1e-7)

        if name != "static":  # the runs' outputs differ in size (batch: with the input; nonzero: with the data)
            assert len({shape for n, shape in sizes if n == name}) > 1
        bad = {label: (kind, msg, inp) for label, kind, msg, inp in info["bad"]}
        for label in ("rank", "dtype", "fixed_dim") + (("bounds",) if dynamic else ()):
            kind, msg, inp = bad[label]
            assert kind == "InputError" and inp == "x" and "input 'x'" in msg, (label, bad[label])
        assert "complex64" in bad["dtype"][1]
        assert bad["count"][0] == "InputError" and "takes 1 inputs (x), got 2" in bad["count"][1]
        if dynamic:
            assert "b = 9 is outside its bounds [1, 8]" in bad["bounds"][1]
