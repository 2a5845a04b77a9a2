"""Helpers of the remote cache / remote execution tests (see conftest.py): copies of
the workspace, a Bazel server per (workspace, output base), and the execution log."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BAZEL = os.environ.get("BAZEL", "bazel")
JOBS = os.environ.get("CUVIL_BAZEL_JOBS", "2")

# What the tests build: the example models for the host and aarch64 (capture once, one
# compile per platform), the tiny model with a weights file, the MLP with a plugin
# (its header is a compile input) and the C++ app's test over two models.
MODEL_TARGETS = [
    "//examples/models:resnet50_host",
    "//examples/models:resnet50_aarch64",
    "//examples/models:mobilenetv2_host",
    "//examples/models:mobilenetv2_aarch64",
    "//tests/remote:tiny_host",
    "//tests/remote:tiny_aarch64",
    "//tests/bazel:mlp_with_plugin",
]
CPP_APP_TEST = "//examples/cpp_app:cpp_app_test"
ALL_TARGETS = MODEL_TARGETS + [CPP_APP_TEST]

# What a test's second workspace must hit in the cache: the Cuvil stages and linking.
CUVIL_AND_LINK = ("CuvilCapture", "CuvilCompile", "CppLink")


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


class Bazel:
    """`bazel --output_base=<own dir> COMMAND ...` in `workspace`, with
    $CUVIL_BAZEL_JOBS (default 2) jobs and no convenience symlinks."""

    def __init__(self, workspace: Path, output_base: Path):
        self.workspace = Path(workspace)
        self.output_base = Path(output_base)
        # No ~/.bazelrc (a developer's disk cache would answer instead of the remote);
        # an idle server (a test that died before shutdown) exits by itself.
        self.startup = ["--nohome_rc", f"--output_base={self.output_base}", "--max_idle_secs=600"]
        if shutil.which(BAZEL) is None:
            pytest.fail(f"{BAZEL!r} is not on PATH: run `make setup` (installs bazel-bootstrap)")

    def __call__(self, command: str, *args: str, check: bool = True, timeout: float = 900):
        cmd = [BAZEL, *self.startup, command]
        cmd += list(args)
        if command in ("build", "test", "run", "info", "aquery", "cquery"):
            cmd += [f"--jobs={JOBS}", "--symlink_prefix=/"]
        proc = subprocess.run(cmd, cwd=self.workspace, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{_tail(proc.stderr)}")
        return proc

    def build(self, *args: str, **kwargs):
        return self("build", *args, **kwargs)

    def test(self, *args: str, **kwargs):
        return self("test", *args, **kwargs)

    def shutdown(self, remove: bool = True):
        subprocess.run([BAZEL, *self.startup, "shutdown"], cwd=self.workspace,
                       capture_output=True, timeout=300)
        if remove:
            rmtree(self.output_base)


def rmtree(path: Path):
    """shutil.rmtree that also removes Bazel's read-only trees."""
    def make_writable_and_retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            os.chmod(p, stat.S_IRWXU)
            func(p)
        except OSError:
            pass
    if Path(path).exists():
        shutil.rmtree(path, onerror=make_writable_and_retry)


# -- workspaces ----------------------------------------------------------------------------

def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=cuvil-tests", "-c", "user.email=cuvil-tests@localhost",
                           "-c", "commit.gpgsign=false", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout


def snapshot_workspace(dest: Path, source: str = "worktree") -> Path:
    """A copy of this repository in `dest`, made a git repository with one commit.

    source "worktree" (default): the working tree as it is (tracked and untracked
    files that git does not ignore); "head": the files of HEAD plus the untracked ones
    (others' uncommitted edits of tracked files left out)."""
    dest.mkdir(parents=True)
    if source == "head":
        archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=REPO, check=True,
                                 capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest)
        listing = ["ls-files", "-z", "--others", "--exclude-standard"]
    else:
        listing = ["ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    for rel in _git(*listing, cwd=REPO).split("\0"):
        src = REPO / rel
        if not rel or rel == "user.bazelrc" or not (src.is_file() or src.is_symlink()):
            continue  # deleted in the working tree; a developer's local Bazel settings
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)
    _git("init", "-q", cwd=dest)
    _git("add", "-A", cwd=dest)
    _git("commit", "-q", "-m", "snapshot of the Cuvil workspace for tests/remote", cwd=dest)
    return dest


def clone_workspace(src: Path, dest: Path) -> Path:
    """`git clone` of a snapshot into another directory."""
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(src), str(dest)], check=True,
                   capture_output=True)
    return dest


def restore(workspace: Path, rel: str):
    """Undo a test's edit of `rel` in one of the test's own clones."""
    _git("checkout", "-q", "HEAD", "--", rel, cwd=workspace)


# -- the execution log ---------------------------------------------------------------------

def read_execution_log(path: Path) -> list[dict]:
    """The spawns of --execution_log_json_file (a stream of JSON objects)."""
    text = Path(path).read_text()
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
    return bool(spawn.get("remoteCacheHit")) or spawn.get("runner") == "remote cache hit"


def executed_remotely(spawn: dict) -> bool:
    """Ran on the remote-execution worker (not served from a cache, not local)."""
    return spawn.get("runner") == "remote" and not spawn.get("remoteCacheHit")


def succeeded(spawn: dict) -> bool:
    return int(spawn.get("exitCode", 0)) == 0 and spawn.get("status", "") in ("", "SUCCESS")


def spawn_name(spawn: dict) -> str:
    """Mnemonic and first declared output: names one action of a build."""
    outputs = sorted(spawn.get("listedOutputs", []))
    return f"{spawn['mnemonic']} {outputs[0] if outputs else '?'}"


def spawn_key(spawn: dict) -> str:
    """What the remote cache keys an action on: command line, environment, platform,
    every input's path and digest, the declared outputs."""
    parts = {
        "args": spawn.get("commandArgs", []),
        "env": sorted((e["name"], e["value"]) for e in spawn.get("environmentVariables", [])),
        "platform": spawn.get("platform", {}),
        "inputs": sorted((f["path"], f.get("digest", {}).get("hash", "")) for f in spawn.get("inputs", [])),
        "outputs": sorted(spawn.get("listedOutputs", [])),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def output_digests(spawns: list[dict]) -> dict[str, str]:
    """Output path -> sha256 of its content, for every output a spawn produced."""
    out = {}
    for s in spawns:
        for f in s.get("actualOutputs", []):
            digest = f.get("digest", {}).get("hash")
            if digest:
                out[f["path"]] = digest
    return out


def describe(spawns: list[dict]) -> str:
    return "\n".join(f"  {spawn_name(s)}: runner={s.get('runner')!r} hit={cache_hit(s)} exit={s.get('exitCode', 0)}"
                     for s in spawns)
