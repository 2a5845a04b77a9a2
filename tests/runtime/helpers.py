"""Helpers of the runtime tests: small models built through the real pipeline (capture ->
passes -> codegen -> objects) with their manifests and headers, and C program runners."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from cuvil import api
from cuvil.backend.header import render_header
from cuvil.backend.llvm.codegen import generate
from cuvil.backend.llvm.select import KernelTarget, kernel_passes
from cuvil.backend.llvm.target import compile_to_object, host_target
from cuvil.backend.llvm.weights import weights_object
from cuvil.native import link_artifact
from cuvil.passes.pipeline import default_pipeline, run_pipeline
from cuvil.runtime import RUNTIME_DIR

CNN_LABELS = ["tench", 'say "hi"', "caf\u00e9", "back\\slash", "tab\there", "?? trigraph", "*/ comment",
              "seven", "eight", "nine"]


@dataclass
class Model:
    """A compiled test model: objects, manifest, header, and how to get reference numbers."""
    prefix: str
    dir: Path
    objects: list[Path]
    manifest: dict
    header: Path
    module: torch.nn.Module
    artifacts: dict = field(default_factory=dict)

    def reference(self, *arrays: np.ndarray) -> list[np.ndarray]:
        with torch.no_grad():
            out = self.module(*(torch.from_numpy(a) for a in arrays))
        out = out if isinstance(out, tuple) else (out,)
        return [o.numpy() for o in out]

    def random_inputs(self, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(t["shape"]).astype(np.float32) for t in self.manifest["inputs"]]

    def artifact(self, kind: str) -> Path:
        """The linked exe / .so / .a (linked on first use)."""
        if kind not in self.artifacts:
            name = {"exe": self.prefix, "shared": f"lib{self.prefix}.so", "static": f"lib{self.prefix}.a"}[kind]
            self.artifacts[kind] = link_artifact(kind, self.objects, self.manifest, self.header, self.dir / name)
        return self.artifacts[kind]


def build_model(module: torch.nn.Module, examples: tuple, prefix: str, out_dir: Path, **extra) -> Model:
    """Compile `module` to model.o + weights.o and write a manifest-faithful header."""
    module.eval()
    ir = api._to_ir(module, examples)
    target = host_target()
    run_pipeline(ir, default_pipeline(**kernel_passes(KernelTarget.of(target))))
    gen = generate(ir, prefix)
    out_dir.mkdir(parents=True, exist_ok=True)
    objects = [out_dir / "model.o", out_dir / "weights.o"]
    objects[0].write_bytes(compile_to_object(gen.llvm_ir, target))
    objects[1].write_bytes(weights_object(f"{prefix}_weights", gen.weights, target))
    manifest = {
        "format": "cuvil-manifest-1", "prefix": prefix,
        "target": {"triple": target.triple, "cpu": target.cpu, "features": target.features},
        "arena_size": gen.arena_size,
        "inputs": [{"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in gen.inputs],
        "outputs": [{"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in gen.outputs],
        "preprocess": {}, "postprocess": {},
    }
    manifest.update(extra)
    header = out_dir / f"{prefix}.h"
    header.write_text(render_header(manifest))
    return Model(prefix, out_dir, objects, manifest, header, module)


class TinyCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


class Identity(torch.nn.Module):
    def forward(self, x):
        return x * 1.0


class TwoInOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(12, 6)

    def forward(self, x, y):
        h = self.fc(x) + y
        return torch.relu(h), torch.tanh(h) * 2.0


def compile_c(sources: list, out: Path, *extra: str, cwd: Path | None = None) -> Path:
    """Compile and link a C test program with warnings as errors; fail the test on any diagnostic."""
    cmd = ["cc", "-std=c99", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-I", str(RUNTIME_DIR),
           "-o", str(out), *map(str, sources), *extra, "-lm", "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    return out


def run_c(exe: Path, *args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)


def close(got: np.ndarray, ref: np.ndarray, rel: float = 1e-5) -> bool:
    """Equal shapes and |got - ref| <= rel * max|ref| everywhere."""
    got, ref = np.asarray(got), np.asarray(ref)
    scale = max(float(np.abs(ref).max()), 1e-30)
    return got.shape == ref.shape and float(np.abs(got.astype(np.float64) - ref).max()) <= rel * scale
