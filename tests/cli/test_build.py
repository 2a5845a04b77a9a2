"""`cuvil build` and the stage subcommands: executables against cuvil.compile and torch,
the cache, determinism across directories, the framework-free compile stage."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import cuvil
from cuvil.build import build
from cuvil.cli import main
from cuvil.config import load_config

ROOT = Path(__file__).resolve().parents[2]
REL_TOL = 1e-4

MODEL_PY = '''\
import torch
from torch import nn


def cuvil_entry():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    return model.eval(), (torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)
'''
CONFIG = '''\
model:
  framework: pytorch
  name: tiny
  source: model.py
  entry: cuvil_entry
inputs:
  - name: x
    shape: [1, 3, 16, 16]
    dtype: f32
outputs:
  - name: scores
optimize:
  threads: {threads}
'''


def project(path: Path, threads: int = 1) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.py").write_text(MODEL_PY)
    (path / "config.yaml").write_text(CONFIG.format(threads=threads))
    return path / "config.yaml"


def run_exe(exe: Path, inputs: list[np.ndarray], tmp: Path, *extra: str) -> np.ndarray:
    args = []
    for i, x in enumerate(inputs):
        np.save(tmp / f"in{i}.npy", x)
        args += ["--input", str(tmp / f"in{i}.npy")]
    out = tmp / "out.npy"
    proc = subprocess.run([str(exe), *args, "--output", str(out), *extra], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return np.load(out)


def test_build_runs_and_matches_compile_and_torch(tmp_path):
    cfg_path = project(tmp_path / "p")
    logs = []
    exe = build(load_config(cfg_path), tmp_path / "dist" / "tiny", log=logs.append)
    import importlib.util  # noqa: PLC0415  (a private name: no sys.modules["model"] left behind)
    spec = importlib.util.spec_from_file_location("test_build_tiny_model", tmp_path / "p" / "model.py")
    user_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(user_model)
    m, (x,) = user_model.cuvil_entry()
    with torch.no_grad():
        ref = m(x).numpy()
    got = run_exe(exe, [x.numpy()], tmp_path)
    via_api = cuvil.compile(m, (x,))(x.numpy())[0]
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= REL_TOL * scale
    np.testing.assert_array_equal(got, via_api)  # the same generated code
    assert [line.split()[0] for line in logs] == ["[capture]", "[compile]", "[link]", "[build]"]
    assert all("done" in line for line in logs[:3])


def test_second_build_does_no_work_and_changed_option_redoes_only_what_it_affects(tmp_path):
    cfg_path = project(tmp_path / "p")
    cache = tmp_path / "cache"
    logs = []
    build(load_config(cfg_path), tmp_path / "a", cache_dir=cache, log=logs.append)
    first = sorted(p.relative_to(cache) for p in cache.rglob("*"))
    logs.clear()
    build(load_config(cfg_path), tmp_path / "a", cache_dir=cache, log=logs.append)
    assert all("cached" in line for line in logs[:3]), logs
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == first  # nothing new written
    # A compile option: capture stays cached, compile and link run again.
    (tmp_path / "p" / "config.yaml").write_text(CONFIG.format(threads=2))
    logs.clear()
    build(load_config(cfg_path), tmp_path / "a", cache_dir=cache, log=logs.append)
    assert "cached" in logs[0] and "done" in logs[1] and "done" in logs[2], logs
    # Editing the model source re-captures.
    (tmp_path / "p" / "model.py").write_text(MODEL_PY.replace("nn.Linear(8, 5)", "nn.Linear(8, 6)"))
    logs.clear()
    build(load_config(cfg_path), tmp_path / "a", cache_dir=cache, log=logs.append)
    assert "done" in logs[0], logs


def test_builds_in_two_directories_are_byte_identical(tmp_path):
    outs = []
    for d in ("one", "two/deeper"):
        cfg_path = project(tmp_path / d)
        cache = tmp_path / d / "cache"
        build(load_config(cfg_path), tmp_path / d / "tiny", cache_dir=cache, log=lambda s: None)
        files = {p.name: p.read_bytes() for p in cache.rglob("*") if p.is_file() and p.name != "deps.json"}
        files["exe"] = (tmp_path / d / "tiny").read_bytes()
        outs.append(files)
    assert set(outs[0]) == {"model.cvir", "tiny.o", "tiny.weights.o", "tiny.h", "tiny.json", "tiny", "exe"}
    for name in outs[0]:
        assert outs[0][name] == outs[1][name], f"{name} differs between directories"
    assert b"/one/" not in outs[0]["exe"] and str(tmp_path).encode() not in outs[0]["tiny.o"]


def test_stage_subcommands_and_framework_free_compile(tmp_path):
    cfg_path = project(tmp_path / "p")
    cvir = tmp_path / "m.cvir"
    assert main(["capture", "--config", str(cfg_path), "--output", str(cvir)]) == 0
    out_dir = tmp_path / "compiled"
    # The compile stage must not import torch: make importing it fail.
    code = ("import sys; sys.modules['torch'] = None; from cuvil.cli import main; "
            f"sys.exit(main(['compile', {str(cvir)!r}, '--config', {str(cfg_path)!r}, '--output-dir', {str(out_dir)!r}]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "compiler")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out_dir / "tiny.json").read_text())
    assert manifest["inputs"] == [{"name": "x", "shape": [1, 3, 16, 16], "dtype": "f32"}]
    assert manifest["outputs"][0]["name"] == "scores"
    for kind, name in [("executable", "tiny"), ("shared", "libtiny.so"), ("static", "libtiny.a")]:
        assert main(["link", str(out_dir), "--kind", kind, "--output", str(tmp_path / name)]) == 0
        assert (tmp_path / name).stat().st_size > 0
    assert main(["inspect", str(cvir), "--summary"]) == 0


def test_cli_errors_are_one_line_with_exit_1(tmp_path, capsys):
    cfg_path = project(tmp_path / "p")
    cfg_path.write_text(cfg_path.read_text().replace("entry: cuvil_entry", "entry: nope"))
    assert main(["build", "--config", str(cfg_path), "--output", str(tmp_path / "x"),
                 "--cache-dir", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cuvil: error: {cfg_path}:5: model.entry: 'nope' is not a function")
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def mobilenet_exe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mbv2")
    cfg = load_config(ROOT / "examples" / "mobilenet_v2.yaml")
    return build(cfg, tmp / "mobilenet_v2", cache_dir=tmp / "cache", log=lambda s: None)


def _torchvision_style(path: Path) -> np.ndarray:
    """Resize(256) + CenterCrop(224) + ToTensor + Normalize, the PIL way."""
    from PIL import Image
    img = Image.open(path).convert("RGB")
    w, h = img.size
    s = 256 / min(w, h)
    img = img.resize((int(w * s) if w > h else 256, int(h * s) if h > w else 256), Image.BILINEAR)
    w, h = img.size
    left, top = int(round((w - 224) / 2.0)), int(round((h - 224) / 2.0))
    x = np.asarray(img.crop((left, top, left + 224, top + 224)), np.float32) / 255.0
    x = (x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def test_mobilenet_executable_names_the_cat_with_torchs_top5(mobilenet_exe, tmp_path):
    from examples.models.mobilenet_v2 import pretrained_mobilenet_v2
    out = tmp_path / "pred.json"
    proc = subprocess.run([str(mobilenet_exe), "--input", str(ROOT / "examples" / "cat.jpg"), "--output", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    top = json.loads(out.read_text())["top_k"]
    assert top[0]["index"] in range(281, 286)  # tabby, tiger, Persian, Siamese, Egyptian cat
    x = _torchvision_style(ROOT / "examples" / "cat.jpg")
    with torch.no_grad():
        logits = pretrained_mobilenet_v2()(torch.from_numpy(x)).numpy()[0]
    assert [t["index"] for t in top] == [int(i) for i in np.argsort(-logits)[:5]]
    # The same tensor as .npy: the executable's logits equal torch's within the core tolerance.
    got = run_exe(mobilenet_exe, [x], tmp_path)
    assert np.abs(got[0] - logits).max() <= REL_TOL * np.abs(logits).max()


@pytest.mark.parametrize("template, inputs", [
    ("pytorch-bert", lambda: __import__("examples.models.bert", fromlist=["x"]).example_inputs()),
    ("pytorch-mlp", lambda: __import__("examples.models.mlp", fromlist=["x"]).example_inputs()),
])
def test_template_builds_run_and_match_torch(tmp_path, template, inputs):
    cfg_path = tmp_path / "config.yaml"
    assert main(["init", "--template", template, str(cfg_path)]) == 0
    exe = build(load_config(cfg_path), tmp_path / "model", cache_dir=tmp_path / "cache", log=lambda s: None)
    cfg = load_config(cfg_path)
    mod = __import__(cfg.data["model"]["module"], fromlist=["cuvil_entry"])
    model, xs = mod.cuvil_entry()
    with torch.no_grad():
        ref = model(*xs).numpy()
    if template == "pytorch-mlp":  # classification JSON: compare the raw logits
        args = []
        for i, x in enumerate(xs):
            np.save(tmp_path / f"in{i}.npy", x.numpy())
            args += ["--input", str(tmp_path / f"in{i}.npy")]
        out = tmp_path / "out.json"
        subprocess.run([str(exe), *args, "--output", str(out), "--logits"], check=True)
        got = np.array(json.loads(out.read_text())["logits"], np.float32).reshape(ref.shape)
    else:
        got = run_exe(exe, [x.numpy() for x in xs], tmp_path)
    assert np.abs(got - ref).max() <= REL_TOL * np.abs(ref).max()


def test_resnet50_builds_through_the_same_path(tmp_path):
    cfg = load_config(ROOT / "examples" / "resnet50.yaml")
    exe = build(cfg, tmp_path / "resnet50", cache_dir=tmp_path / "cache", log=lambda s: None)
    from examples.models.resnet import cuvil_entry
    model, (x,) = cuvil_entry()
    with torch.no_grad():
        ref = model(x).numpy()
    got = run_exe(exe, [x.numpy()], tmp_path)
    assert np.abs(got - ref).max() <= REL_TOL * np.abs(ref).max()
    shutil.rmtree(tmp_path / "cache")
