"""Helpers of the tests that drive Bazel (see conftest.py): a Bazel server with an
output base of its own, and the execution log's spawns."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BAZEL = os.environ.get("BAZEL", "bazel")


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


class Bazel:
    """`bazel --output_base=<own dir> COMMAND ...` in the repository (or `workspace`), with
    $CUVIL_BAZEL_JOBS (default 2) jobs and no convenience symlinks in the workspace."""

    def __init__(self, output_base: Path, workspace: Path = REPO):
        self.output_base = output_base
        self.workspace = workspace
        if shutil.which(BAZEL) is None:
            pytest.fail(f"{BAZEL!r} is not on PATH: run `make setup` (installs bazel-bootstrap)")

    def __call__(self, command: str, *args: str, check: bool = True, timeout: float = 1800):
        cmd = [BAZEL, f"--output_base={self.output_base}", command]
        if command in ("build", "test", "run", "info"):
            cmd += [f"--jobs={os.environ.get('CUVIL_BAZEL_JOBS', '2')}", "--symlink_prefix=/"]
        cmd += list(args)
        proc = subprocess.run(cmd, cwd=self.workspace, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{_tail(proc.stderr)}")
        return proc

    def build(self, *args: str, **kwargs):
        return self("build", *args, **kwargs)

    def bin(self, path: str) -> Path:
        """An output of the top-level (target) configuration, e.g. 'examples/models/x'."""
        if not hasattr(self, "_bin"):
            self._bin = Path(self("info", "bazel-bin").stdout.strip())
        return self._bin / path

    def shutdown(self):
        subprocess.run([BAZEL, f"--output_base={self.output_base}", "shutdown"], cwd=self.workspace,
                       capture_output=True, timeout=300)
        _rmtree(self.output_base)


def _rmtree(path: Path):
    def make_writable_and_retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            os.chmod(p, stat.S_IRWXU)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=make_writable_and_retry)


def read_execution_log(path: Path) -> list[dict]:
    """The spawns of --execution_log_json_file (a stream of JSON objects)."""
    text = path.read_text()
    decoder = json.JSONDecoder()
    spawns, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return spawns
        obj, i = decoder.raw_decode(text, i)
        spawns.append(obj)


def cache_hit(spawn: dict) -> bool:
    # Bazel 4.2.3 reports disk-cache hits as "remote cache hit".
    return bool(spawn.get("remoteCacheHit")) or spawn.get("runner") == "remote cache hit"
