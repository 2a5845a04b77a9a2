"""Hermeticity under remote execution: the worker runs an action on its declared
inputs only (its execroot holds nothing else; the client's workspaces are empty
directories there; no network), so

- an action reading a file it did not declare fails on the worker, while the same
  action works in a local unsandboxed build (the check can fail, and does);
- the Cuvil actions, which succeed on the worker, declare everything they read: the
  compiler's sources, requirements.lock, the runtime sources, plugin headers, the
  model's sources, weights and config; their environment is fixed (no HOME, no PATH,
  PYTHONPATH inside the execroot), and their interpreter, at a fixed path, cannot
  import the compiler from anywhere but those declared sources.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from remote_helpers import describe, executed_remotely, read_execution_log

PROBE_FILE = "tests/remote/probe_input.txt"


@pytest.fixture(scope="module")
def probes(remote):
    bazel = remote.bazel(remote.clone, "probes")
    yield bazel
    bazel.shutdown()


def _probe(remote, bazel, tmp_path, target, *flags, where="remote"):
    log = tmp_path / f"{target.rsplit(':', 1)[1]}-{where}.json"
    if where == "remote":
        mode = remote.remote_execution_flags()
    else:  # local, unsandboxed: the action sees the whole execroot and the machine
        mode = [f"--repo_env=CUVIL_PYTHON={remote.python}", "--spawn_strategy=standalone", "--disk_cache="]
    proc = bazel.build(target, *mode, *flags, f"--execution_log_json_file={log}", check=False)
    spawns = [s for s in read_execution_log(log) if s["mnemonic"] == "CuvilProbe"]
    assert len(spawns) == 1, describe(read_execution_log(log))
    return proc, spawns[0]


def test_declared_input_is_read_on_the_worker(remote, probes, tmp_path):
    proc, spawn = _probe(remote, probes, tmp_path, "//tests/remote:reads_declared_input")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert executed_remotely(spawn), spawn.get("runner")
    assert [f["path"] for f in spawn["inputs"]] == [PROBE_FILE]


def test_undeclared_input_fails_on_the_worker(remote, probes, tmp_path):
    target = "//tests/remote:reads_undeclared_input"
    proc, spawn = _probe(remote, probes, tmp_path, target)
    assert proc.returncode != 0, "an action read a file it did not declare on the worker"
    assert executed_remotely(spawn) and int(spawn.get("exitCode", 0)) != 0, spawn
    assert f"{PROBE_FILE}: No such file or directory" in proc.stderr, proc.stderr[-3000:]
    # The same action, unisolated on the client, finds the file: only the isolation
    # made it fail.
    proc, spawn = _probe(remote, probes, tmp_path, target, where="local")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert spawn["runner"] in ("standalone", "local"), spawn["runner"]


def test_client_checkout_is_not_visible_on_the_worker(remote, probes, tmp_path):
    target = "//tests/remote:reads_checkout_by_absolute_path"
    absolute = f"--define=cuvil_probe_path={remote.clone / PROBE_FILE}"
    proc, spawn = _probe(remote, probes, tmp_path, target, absolute)
    assert proc.returncode != 0, "an action read the client's checkout by absolute path on the worker"
    assert executed_remotely(spawn), spawn
    assert "No such file or directory" in proc.stderr, proc.stderr[-3000:]
    proc, _ = _probe(remote, probes, tmp_path, target, absolute, where="local")
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_worker_actions_have_no_network(remote, probes, tmp_path):
    target = "//tests/remote:connects_to_loopback_port"
    port = f"--define=cuvil_probe_port={remote.nginx.port}"  # nginx listens there on 127.0.0.1
    proc, spawn = _probe(remote, probes, tmp_path, target, port)
    assert proc.returncode != 0, "an action on the worker reached 127.0.0.1:%d" % remote.nginx.port
    assert executed_remotely(spawn), spawn
    assert "Connection refused" in proc.stderr or "Network is unreachable" in proc.stderr, proc.stderr[-3000:]
    proc, _ = _probe(remote, probes, tmp_path, target, port, where="local")
    assert proc.returncode == 0, proc.stderr[-3000:]


# -- what the Cuvil actions declare ----------------------------------------------------

ENV = {"PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE", "PYTHONHASHSEED"}


def _compiler_sources(workspace) -> set[str]:
    """The files of //:compiler_srcs (BUILD.bazel's globs), in the workspace."""
    root = workspace / "compiler" / "cuvil"
    files = set(root.rglob("*.py")) | set((root / "runtime").glob("*.c")) | set((root / "runtime").glob("*.h")) \
        | set((root / "templates").glob("*.yaml"))
    return {str(f.relative_to(workspace)) for f in files if "__pycache__" not in f.parts}


def _inputs(spawn) -> set[str]:
    return {f["path"] for f in spawn["inputs"]}


def _by_output(spawns, mnemonic, suffix):
    found = [s for s in spawns if s["mnemonic"] == mnemonic and any(p.endswith(suffix) for p in s["listedOutputs"])]
    assert found, f"no {mnemonic} with an output ending in {suffix}"
    return found


def test_cuvil_actions_declare_what_they_read(remote, remote_execution):
    spawns = remote_execution["build_spawns"]
    cuvil = [s for s in spawns if s["mnemonic"] in ("CuvilCapture", "CuvilCompile")]
    assert len(cuvil) == 11, describe(cuvil)
    # They all ran on the worker, where only declared inputs exist, and succeeded.
    assert all(executed_remotely(s) and int(s.get("exitCode", 0)) == 0 for s in cuvil), describe(cuvil)
    compiler = _compiler_sources(remote.clone)
    assert "compiler/cuvil/runtime/cuvil_runtime.c" in compiler and "compiler/cuvil/cli.py" in compiler
    for s in cuvil:
        inputs = _inputs(s)
        name = s["listedOutputs"][0]
        missing = compiler - inputs
        assert not missing, f"{name}: compiler files not declared: {sorted(missing)[:10]}"
        assert "requirements.lock" in inputs, name
        assert not any(p.startswith("/") for p in inputs), name
        env = {e["name"]: e["value"] for e in s["environmentVariables"]}
        assert set(env) == ENV, f"{name}: environment {sorted(env)}"
        assert not any(p.startswith("/") for p in env["PYTHONPATH"].split(":")), env["PYTHONPATH"]
        assert s["commandArgs"][0] == str(remote.python), s["commandArgs"][0]

    def has(mnemonic, suffix, *paths):
        for s in _by_output(spawns, mnemonic, suffix):
            missing = set(paths) - _inputs(s)
            assert not missing, f"{mnemonic} {suffix}: not declared: {sorted(missing)}"

    # The model's sources, weights and config (capture); the .cvir, config, weights,
    # driver (compile); plugin headers (compile of a model with a plugin).
    has("CuvilCapture", "tiny_capture.cvir", "tests/remote/cuvil_tiny_model.py", "tests/remote/tiny.yaml",
        "tests/remote/tiny_weights.npz")
    has("CuvilCapture", "resnet50_capture.cvir", "examples/models/resnet.py", "examples/models/__init__.py",
        "examples/__init__.py", "examples/resnet50.yaml", "examples/imagenet_labels.txt")
    has("CuvilCapture", "mobilenetv2_capture.cvir", "examples/models/mobilenet_v2.py",
        "external/mobilenet_v2_weights/file/mobilenet_v2-b0353104.pth")
    has("CuvilCompile", "/tiny.o", "tests/remote/tiny.yaml", "tests/remote/tiny_weights.npz",
        "rules/private/compile_model.py")
    has("CuvilCompile", "/mlp_with_plugin.o", "tests/bazel/plugin_stub.h", "tests/bazel/mlp.yaml")
    for s in _by_output(spawns, "CuvilCompile", ".o"):
        assert any(p.endswith("_capture.cvir") for p in _inputs(s)), s["listedOutputs"]


def test_interpreter_cannot_import_the_compiler_by_itself(remote):
    """The fixed-path interpreter has the locked packages but not the compiler's
    editable install: an action can only import the compiler from PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    ok = subprocess.run([str(remote.python), "-c", "import numpy, torch, llvmlite, yaml"], cwd="/", env=env,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr[-2000:]
    no = subprocess.run([str(remote.python), "-c", "import cuvil"], cwd="/", env=env, capture_output=True, text=True)
    assert no.returncode != 0 and "No module named 'cuvil'" in no.stderr, no.stderr[-2000:]
