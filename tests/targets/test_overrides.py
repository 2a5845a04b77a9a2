"""Conditional configuration: `overrides` entries apply only for their targets, merge
into the base config (inputs/outputs by name, `null` removes a key) and are validated
like the rest, with file:line errors that name the override."""
from __future__ import annotations

import pytest

from cuvil.build import compile_options
from cuvil.options import TargetSpec
from cuvil.config import ConfigError, load_config

from .helpers import TINY_PY, TINY_YAML

OVERRIDES = '''\
target:
  arch: host
  cpu: x86-64-v3
optimize:
  threads: 4
overrides:
  - when: {target: wasm32-wasi}
    optimize: {threads: 1}
  - when: {target: [aarch64-linux-gnu, wasm32-wasi]}
    inputs:
      - name: x
        preprocess: null
    outputs:
      - name: probs
        postprocess: {kind: classification, top_k: 3}
  - when: {target: x86_64-linux-gnu}
    optimize: {fuse: false}
'''


def _config(tmp_path, body: str, preprocess: bool = True):
    (tmp_path / "model.py").write_text(TINY_PY)
    base = TINY_YAML
    if preprocess:
        base = base.replace("    dtype: f32\n", "    dtype: f32\n    preprocess: {kind: image}\n", 1)
    path = tmp_path / "config.yaml"
    path.write_text(base + body)
    return path


def test_overrides_apply_only_for_their_targets(tmp_path):
    path = _config(tmp_path, OVERRIDES)
    host = load_config(path)
    assert host.target == "host" and host.applied == (2,)  # `host` is x86_64-linux-gnu
    assert host.data["optimize"] == {"threads": 4, "fuse": False}
    assert host.data["inputs"][0]["preprocess"] == {"kind": "image"}
    wasm = load_config(path, target="wasm32-wasi")
    assert wasm.applied == (0, 1)
    assert wasm.data["optimize"] == {"threads": 1}
    assert "preprocess" not in wasm.data["inputs"][0] and wasm.data["inputs"][0]["shape"] == [1, 3, 16, 16]
    assert wasm.data["outputs"][0] == {"name": "probs", "postprocess": {"kind": "classification", "top_k": 3}}
    arm = load_config(path, target="aarch64-linux-gnu")
    assert arm.applied == (1,) and arm.data["optimize"]["threads"] == 4
    opts = compile_options(wasm)
    assert opts.threads == 1 and opts.preprocess == {}
    # target.cpu belongs to the config's own arch; another --target does not inherit it
    assert opts.target == TargetSpec("wasm32-wasi", "", "")
    assert compile_options(host).target == TargetSpec("host", "x86-64-v3", "")


@pytest.mark.parametrize("body, key, line, words", [
    ("overrides:\n  - when: {target: wasm32-wasi}\n    optimize: {threads: zero}\n",
     "overrides[0].optimize.threads", 15, "not of type 'integer'"),
    ("overrides:\n  - when: {target: riscv64}\n    optimize: {threads: 1}\n",
     "overrides[0].when.target", 14, "not a target or a list of targets"),
    ("overrides:\n  - optimize: {threads: 1}\n", "overrides[0]", 14, "'when' is a required property"),
    ("overrides:\n  - when: {target: wasm32-wasi}\n    model: {entry: other}\n",
     "overrides[0].model", 15, "unknown key"),
    ("overrides:\n  - when: {target: wasm32-wasi}\n    target: {arch: aarch64-linux-gnu}\n",
     "overrides[0].target.arch", 15, "unknown key"),
    ("overrides:\n  - when: {target: wasm32-wasi}\n    inputs: [{name: y, shape: [1]}]\n",
     "overrides[0].inputs", 15, "names 'y', which is not in the base config's inputs"),
    ("overrides:\n  - when: {target: wasm32-wasi}\n    optimize: {threads: 0}\n",
     "overrides[0].optimize.threads", 15, "0 is less than the minimum of 1"),
])
def test_errors_in_overrides_name_key_and_line(tmp_path, body, key, line, words):
    path = _config(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        load_config(path, target="wasm32-wasi")
    msg = str(e.value)
    assert msg.startswith(f"{path}:{line}: {key}:"), msg
    assert words in msg, msg


def test_override_for_another_target_is_still_validated(tmp_path):
    path = _config(tmp_path, "overrides:\n  - when: {target: wasm32-wasi}\n    optimize: {threads: -1}\n")
    with pytest.raises(ConfigError, match=r"config.yaml:15: overrides\[0\].optimize.threads: .*minimum"):
        load_config(path)  # a host build


def test_merged_config_errors_point_at_the_key_and_the_override(tmp_path):
    path = _config(tmp_path, "overrides:\n  - when: {target: wasm32-wasi}\n    inputs: [{name: x, shape: [1, 3, 16]}]\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, target="wasm32-wasi")
    assert str(e.value) == (f"{path}:8: inputs[0].shape: an image input needs a 4-D shape (with the overrides for "
                            f"target wasm32-wasi: overrides[0] at {path}:14)")
    load_config(path)  # the host build does not use it
