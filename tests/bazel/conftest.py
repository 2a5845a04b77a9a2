"""Tests that drive Bazel (Debian's bazel-bootstrap 4.2.3, offline): cache behaviour,
cross builds run under qemu / node's WASI, the C++ app. Slow, so they run as their
own step:

    pytest tests/bazel          (or CUVIL_BAZEL_TESTS=1 with any other selection)

and are skipped, with that reason, when pytest collects them as part of `pytest
tests`. Each Bazel server here has its own output base in a temporary directory
(the developer's build, its convenience symlinks and its server are left alone) and
is shut down, and its output base deleted, when the tests are done.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BAZEL = os.environ.get("BAZEL", "bazel")


def pytest_configure(config):
    config.addinivalue_line("markers", "bazel: drives Bazel; run with `pytest tests/bazel`")


def _selected_explicitly(config) -> bool:
    if os.environ.get("CUVIL_BAZEL_TESTS") == "1":
        return True
    for arg in config.args:
        path = Path(arg.split("::", 1)[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_collection_modifyitems(config, items):
    explicit = _selected_explicitly(config)
    skip = pytest.mark.skip(reason="Bazel tests run as their own step: pytest tests/bazel")
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if HERE in path.parents:
            item.add_marker(pytest.mark.bazel)
            if not explicit:
                item.add_marker(skip)


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


class Bazel:
    """`bazel --output_base=<own dir> COMMAND ...` in the repository, with
    $CUVIL_BAZEL_JOBS (default 2) jobs and no convenience symlinks in the workspace."""

    def __init__(self, output_base: Path):
        self.output_base = output_base
        if shutil.which(BAZEL) is None:
            pytest.fail(f"{BAZEL!r} is not on PATH: run `make setup` (installs bazel-bootstrap)")

    def __call__(self, command: str, *args: str, check: bool = True, timeout: float = 1800):
        cmd = [BAZEL, f"--output_base={self.output_base}", command]
        if command in ("build", "test", "run", "info"):
            cmd += [f"--jobs={os.environ.get('CUVIL_BAZEL_JOBS', '2')}", "--symlink_prefix=/"]
        cmd += list(args)
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
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
        subprocess.run([BAZEL, f"--output_base={self.output_base}", "shutdown"], cwd=REPO,
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


@pytest.fixture(scope="session")
def bazel(tmp_path_factory):
    """One Bazel server (own output base) shared by the tests that only build and run."""
    b = Bazel(tmp_path_factory.mktemp("bazel-output-base"))
    yield b
    b.shutdown()


@pytest.fixture(scope="module")
def fresh_bazel(tmp_path_factory):
    """A Bazel server of this module's own (for tests that `bazel clean`)."""
    b = Bazel(tmp_path_factory.mktemp("bazel-output-base-fresh"))
    yield b
    b.shutdown()


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
