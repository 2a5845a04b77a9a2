"""The generated C API of a model with symbolic dims, from a C program: shapes set per run,
output shapes reported, torch's numbers at each shape, and the runtime's refusals."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import torch
from torch import nn

from cuvil import api
from cuvil.backend.header import render_header
from cuvil.backend.llvm.codegen import generate
from cuvil.backend.llvm.select import KernelTarget, kernel_passes
from cuvil.backend.llvm.target import compile_to_object, host_target
from cuvil.backend.llvm.weights import weights_object
from cuvil.build import make_manifest
from cuvil.native import link_artifact
from cuvil.passes.pipeline import default_pipeline, run_pipeline
from tests.runtime.helpers import compile_c

C_DIR = Path(__file__).resolve().parents[1] / "runtime" / "c"


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, g):  # x [b, s, 8], g [b, s]
        return torch.softmax(self.fc(x) * g[..., None], dim=1)


def test_c_program_sets_shapes_and_reads_output_shapes(tmp_path):
    torch.manual_seed(0)
    model = Gate().eval()
    examples = (torch.randn(2, 3, 8), torch.randn(2, 3))
    ir = api._to_ir(model, examples, [("b", "s", 8), ("b", "s")], {"b": (1, 4), "s": (1, 64)})
    target = host_target()
    run_pipeline(ir, default_pipeline(**kernel_passes(KernelTarget.of(target))))
    gen = generate(ir, "gate")
    objects = [tmp_path / "model.o", tmp_path / "weights.o"]
    objects[0].write_bytes(compile_to_object(gen.llvm_ir, target))
    objects[1].write_bytes(weights_object("gate_weights", gen.weights, target))
    manifest = make_manifest(gen, target)
    (tmp_path / "gate.h").write_text(render_header(manifest))
    so = link_artifact("shared", objects, manifest, tmp_path / "gate.h", tmp_path / "libgate.so")
    exe = compile_c([C_DIR / "dims_test.c", so], tmp_path / "dims_test", '-DMODEL_HEADER="gate.h"',
                    "-DP(x)=gate_##x", "-I", str(tmp_path), f"-Wl,-rpath,{tmp_path}")
    shapes = [(1, 1), (2, 7), (4, 64), (3, 20)]
    rng = np.random.default_rng(0)
    inputs = {}
    for b, s in shapes:
        inputs[b, s] = (rng.standard_normal((b, s, 8)).astype(np.float32), rng.standard_normal((b, s)).astype(np.float32))
        for i, a in enumerate(inputs[b, s]):
            (tmp_path / f"in_{b}_{s}_{i}.bin").write_bytes(a.tobytes())
    proc = subprocess.run([str(exe), *[str(v) for bs in shapes for v in bs]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ok"), proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("shape")] == [f"shape {b} {s} 8" for b, s in shapes]
    for b, s in shapes:
        got = np.frombuffer((tmp_path / f"out_{b}_{s}.bin").read_bytes(), np.float32).reshape(b, s, 8)
        with torch.no_grad():
            ref = model(*map(torch.from_numpy, inputs[b, s])).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    bounds, fixed, disagree = (next(ln for ln in lines if ln.startswith(k)) for k in ("bounds", "fixed", "disagree"))
    assert bounds.startswith("bounds 8 ") and "dim 0 (b) = 5 is outside its bounds [1, 4]" in bounds
    assert fixed.startswith("fixed 8 ") and "dim 2 is fixed" in fixed
    assert disagree.startswith("disagree 8 ") and "has b = 2, but another input set b = 3" in disagree
