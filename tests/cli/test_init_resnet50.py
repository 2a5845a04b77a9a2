"""The manual's three ResNet-50 commands, verbatim, in an empty directory; `cuvil init`'s
sample photo; `model.checkpoint` (a state dict loaded into the entry's model) and its
errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_build import REL_TOL, _torchvision_style, run_exe

from cuvil.build import build
from cuvil.cli import main
from cuvil.config import load_config
from cuvil.yaml_load import ConfigError

ROOT = Path(__file__).resolve().parents[2]
# docs/cli.md and README.md state these; tests/test_docs.py checks they are run here.
MANUAL = [
    "cuvil init --template pytorch-resnet50 config.yaml",
    "cuvil build --config config.yaml --output ./dist/resnet50-cuvil",
    "./dist/resnet50-cuvil --input examples/cat.jpg --output pred.json",
]


def _env() -> dict:
    """This interpreter's bin directory (the venv's `cuvil`) first on PATH."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "cuvil").exists(), f"no `cuvil` next to {sys.executable}"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "compiler"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_the_manuals_three_commands_work_verbatim_in_an_empty_directory(tmp_path):
    work = tmp_path / "fresh"
    work.mkdir()
    for command in MANUAL:
        proc = subprocess.run(["bash", "-c", command], cwd=work, env=_env(), capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
    assert (work / "examples" / "cat.jpg").read_bytes() == (ROOT / "examples" / "cat.jpg").read_bytes()
    top = json.loads((work / "pred.json").read_text())["top_k"]
    labels = (ROOT / "examples" / "imagenet_labels.txt").read_text().splitlines()
    assert len(top) == 5
    assert [t["label"] for t in top] == [labels[t["index"]] for t in top]
    scores = [t["score"] for t in top]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6
    # The template's model (random weights, seed 0) on the photo pre-processed the torchvision
    # way: the same top class, and its probability within 0.05 (JPEG decoders and resizers differ).
    from examples.models.resnet import cuvil_entry
    model, _ = cuvil_entry()
    with torch.no_grad():
        probs = torch.softmax(model(torch.from_numpy(_torchvision_style(work / "examples" / "cat.jpg"))), 1)[0]
    assert top[0]["index"] == int(probs.argmax())
    assert abs(top[0]["score"] - float(probs.max())) <= 0.05


def test_init_keeps_an_existing_photo_and_writes_none_for_non_image_templates(tmp_path, capsys):
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "cat.jpg").write_bytes(b"my own photo")
    assert main(["init", "--template", "pytorch-resnet50", str(tmp_path / "config.yaml")]) == 0
    assert (tmp_path / "examples" / "cat.jpg").read_bytes() == b"my own photo"
    assert "cat.jpg" not in capsys.readouterr().out
    text = (tmp_path / "config.yaml").read_text()
    assert "THE WEIGHTS ARE RANDOM (seed 0) unless `checkpoint:`" in text
    assert "# checkpoint: resnet50.pth" in text
    other = tmp_path / "mlp"
    assert main(["init", "--template", "pytorch-mlp", str(other / "mlp.yaml")]) == 0
    assert not (other / "examples").exists()


def _resnet50_state(seed: int) -> dict:
    from examples.models import randomize_norm_stats_
    from examples.models.resnet import resnet50
    torch.manual_seed(seed)
    return randomize_norm_stats_(resnet50(), seed=seed).eval().state_dict()


def _torch_logits(state: dict, x: np.ndarray) -> np.ndarray:
    from examples.models.resnet import resnet50
    model = resnet50().eval()
    model.load_state_dict(state)
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def test_a_checkpoint_in_the_template_is_loaded_and_tracked_by_the_cache(tmp_path):
    cfg_path = tmp_path / "project" / "config.yaml"
    assert main(["init", "--template", "pytorch-resnet50", str(cfg_path)]) == 0
    text = cfg_path.read_text()
    cfg_path.write_text(text.replace("  # checkpoint: resnet50.pth", "  checkpoint: weights/resnet50.pth", 1))
    ckpt = tmp_path / "project" / "weights" / "resnet50.pth"   # relative to the config, not the cwd
    ckpt.parent.mkdir()
    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    from examples.models.resnet import cuvil_entry
    with torch.no_grad():
        random_logits = cuvil_entry()[0](torch.from_numpy(x)).numpy()
    cache = tmp_path / "cache"
    for seed in (1, 2):  # a changed file under the same path: the capture is redone
        state = _resnet50_state(seed)
        torch.save(state, ckpt)
        exe = build(load_config(cfg_path), tmp_path / f"resnet50-{seed}", cache_dir=cache, log=lambda s: None)
        got, ref = run_exe(exe, [x], tmp_path), _torch_logits(state, x)
        assert np.abs(got - ref).max() <= REL_TOL * np.abs(ref).max()
        # ... and not the template's random weights (what a checkpoint left unloaded would give)
        assert np.abs(got - random_logits).max() > 100 * REL_TOL * np.abs(ref).max()
    # The capture's cache entries depend on the file's contents (not only on its path).
    deps = [json.loads(p.read_text()) for p in (cache / "capture").glob("*/deps.json")]
    assert deps and all(str(ckpt.resolve()) in d for d in deps)


TINY_PY = '''\
import torch
from torch import nn


def cuvil_entry():
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
'''
TINY_YAML = '''\
model:
  framework: pytorch
  source: model.py
  entry: cuvil_entry
  checkpoint: {checkpoint}
inputs:
  - name: x
    shape: [1, 4]
'''


def _tiny(tmp_path: Path, checkpoint: str = "tiny.pt") -> Path:
    (tmp_path / "model.py").write_text(TINY_PY)
    (tmp_path / "config.yaml").write_text(TINY_YAML.format(checkpoint=checkpoint))
    return tmp_path / "config.yaml"


def _build_error(cfg_path: Path, capsys) -> str:
    assert main(["build", "--config", str(cfg_path), "--output", str(cfg_path.parent / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_missing_checkpoint_names_the_key_and_line(tmp_path):
    cfg_path = _tiny(tmp_path, "nowhere/tiny.pt")
    with pytest.raises(ConfigError, match=r"config\.yaml:5: model\.checkpoint: file not found: .*nowhere/tiny\.pt"):
        load_config(cfg_path)


def test_a_checkpoint_with_other_keys_or_shapes_is_a_one_line_error(tmp_path, capsys):
    cfg_path = _tiny(tmp_path)
    good = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).state_dict()
    state = dict(good)
    state["extra.weight"] = state.pop("0.bias")
    state["2.weight"] = torch.zeros(2, 5)
    torch.save(state, tmp_path / "tiny.pt")
    err = _build_error(cfg_path, capsys)
    assert "config.yaml:5: model.checkpoint:" in err
    assert "1 missing key (0.bias)" in err and "1 unexpected key (extra.weight)" in err
    assert "2.weight is [2, 5] in the file, [2, 3] in the model" in err
    torch.save([1, 2, 3], tmp_path / "tiny.pt")
    assert "not a state dict" in _build_error(cfg_path, capsys)
    (tmp_path / "tiny.pt").write_bytes(b"not a torch file")
    assert "cannot read the state dict" in _build_error(cfg_path, capsys)
    torch.save(good, tmp_path / "tiny.pt")  # the right one builds
    assert main(["build", "--config", str(cfg_path), "--output", str(tmp_path / "out")]) == 0


def test_checkpoint_is_for_pytorch_models(tmp_path):
    (tmp_path / "config.yaml").write_text("model:\n  framework: onnx\n  onnx: m.onnx\n  checkpoint: w.pt\n")
    with pytest.raises(ConfigError, match=r"model\.checkpoint: a state dict checkpoint is for framework pytorch"):
        load_config(tmp_path / "config.yaml")


def test_a_safetensors_checkpoint_is_loaded(tmp_path):
    from safetensors.torch import save_file
    cfg_path = _tiny(tmp_path, "tiny.safetensors")
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).eval()
    save_file(model.state_dict(), str(tmp_path / "tiny.safetensors"))
    exe = build(load_config(cfg_path), tmp_path / "tiny", cache_dir=tmp_path / "cache", log=lambda s: None)
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    got = run_exe(exe, [x], tmp_path)
    assert np.abs(got - ref).max() <= REL_TOL * np.abs(ref).max()
