"""Cuvil's Bazel actions on a real remote cache (nginx, Bazel's HTTP cache protocol)
and a real remote-execution worker (Bazel's own REAPI worker from Debian's
bazel-bootstrap-source, sandboxed, network blocked). They start servers and several
Bazel servers, so they run as their own step:

    pytest tests/remote          (or CUVIL_REMOTE_TESTS=1 with any other selection)

and are skipped, with that reason, when pytest collects them as part of `pytest tests`.

One session directory under $CUVIL_REMOTE_TMP (default /var/tmp; not /tmp, which the
worker's actions see as an empty tmpfs) holds:

    checkout/       a snapshot of this repository (its working tree, one git commit;
                    CUVIL_REMOTE_SOURCE=head: HEAD plus untracked files)
    clone/          `git clone` of it in another directory: the second workspace
    python/         the interpreter every build uses, at one fixed path
                    (--repo_env=CUVIL_PYTHON=...): it is on the Cuvil actions' command
                    lines, so the two workspaces share cache keys only through it
    nginx/          the HTTP cache (127.0.0.1, free port)
    worker/         the REAPI worker (127.0.0.1, free port), built into worker-build/
    ob-*/           one Bazel output base per Bazel server

Every server is stopped by its process id and every Bazel server shut down when the
session ends, whatever happened; the directory is removed (CUVIL_REMOTE_KEEP=1 keeps
it for a look).
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import run_as_own_step

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tools" / "remote"))

import cuvil_remote  # noqa: E402
from remote_helpers import (ALL_TARGETS, CPP_APP_TEST, MODEL_TARGETS, REPO, Bazel, clone_workspace,  # noqa: E402
                            read_execution_log, rmtree, snapshot_workspace)



def pytest_configure(config):
    config.addinivalue_line("markers", "remote: starts nginx and a REAPI worker; run with `pytest tests/remote`")


def pytest_collection_modifyitems(config, items):
    run_as_own_step(config, items, HERE, "CUVIL_REMOTE_TESTS", "remote", "remote cache/execution tests run as their own step: pytest tests/remote")


class Session:
    """The session's directory, workspaces, interpreter and servers (started lazily,
    stopped at the end)."""

    def __init__(self, root: Path):
        self.root = root
        self._bazels: list[Bazel] = []
        self._servers: list[cuvil_remote.Server] = []
        self._nginx = self._worker = None
        self._checkout = self._clone = self._python = None

    # workspaces and interpreter
    @property
    def checkout(self) -> Path:
        if self._checkout is None:
            self._checkout = snapshot_workspace(self.root / "checkout",
                                                os.environ.get("CUVIL_REMOTE_SOURCE", "worktree"))
        return self._checkout

    @property
    def clone(self) -> Path:
        if self._clone is None:
            self._clone = clone_workspace(self.checkout, self.root / "clone")
        return self._clone

    @property
    def python(self) -> Path:
        if self._python is None:
            self._python = cuvil_remote.make_interpreter(self.root / "python")
        return self._python

    # servers
    @property
    def nginx(self) -> cuvil_remote.Server:
        if self._nginx is None:
            self._nginx = cuvil_remote.start_nginx(self.root / "nginx")
            self._servers.append(self._nginx)
        return self._nginx

    @property
    def worker(self) -> cuvil_remote.Server:
        if self._worker is None:
            classes = cuvil_remote.build_worker(self.root / "worker-build")
            # Actions see empty directories where the client's workspaces, this
            # repository (all but the .venv the interpreter's packages are in) and
            # the caches in the home directory are: only declared inputs are readable.
            hide = [self.checkout, self.clone]
            hide += [d for d in sorted(REPO.iterdir()) if d.is_dir() and not d.is_symlink() and d.name != ".venv"]
            hide += [d for d in (Path.home() / ".cache",) if d.is_dir() and not d.is_symlink()]
            # A checkout under /tmp keeps its .venv (the interpreter's packages) there:
            # then /tmp stays visible and the checkout's other entries are hidden one by one.
            under_tmp = REPO.resolve().is_relative_to(Path("/tmp").resolve())
            self._worker = cuvil_remote.start_worker(self.root / "worker", classes, hide=hide,
                                                     hide_tmp=not under_tmp)
            self._servers.append(self._worker)
        return self._worker

    def bazel(self, workspace: Path, name: str) -> Bazel:
        b = Bazel(workspace, self.root / f"ob-{name}")
        self._bazels.append(b)
        return b

    # flags
    def remote_cache_flags(self) -> list[str]:
        return ["--config=remote-cache", f"--remote_cache={self.nginx.url}",
                f"--repo_env=CUVIL_PYTHON={self.python}", "--disk_cache="]

    def remote_execution_flags(self) -> list[str]:
        return ["--config=remote", f"--remote_executor={self.worker.url}",
                f"--repo_env=CUVIL_PYTHON={self.python}", "--disk_cache="]

    def close(self):
        for b in self._bazels:
            try:
                b.shutdown(remove=False)
            except Exception:  # noqa: BLE001 - keep stopping the rest
                pass
        for s in self._servers:
            s.stop()
        if os.environ.get("CUVIL_REMOTE_KEEP") != "1":
            rmtree(self.root)


def _terminate(signum, _frame):
    # A CI time limit's SIGTERM: unwind, so that the servers are stopped and the
    # Bazel servers shut down.
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def remote():
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    base = Path(os.environ.get("CUVIL_REMOTE_TMP", "/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    session = Session(Path(tempfile.mkdtemp(prefix="cuvil-remote-", dir=base)))
    try:
        yield session
    finally:
        session.close()


@pytest.fixture(scope="session")
def reference_build(remote, tmp_path_factory):
    """Every target built in the first workspace, all actions local, results uploaded
    to the (empty) remote cache: the spawns of its execution log."""
    log = tmp_path_factory.mktemp("reference") / "checkout.json"
    bazel = remote.bazel(remote.checkout, "checkout")
    try:
        bazel.build(*ALL_TARGETS, *remote.remote_cache_flags(), f"--execution_log_json_file={log}")
    finally:
        bazel.shutdown()
    return read_execution_log(log)


@pytest.fixture(scope="session")
def remote_execution(remote, tmp_path_factory):
    """The second workspace built on the REAPI worker with a fresh output base (no
    local action cache): `bazel build --config=remote` of the models, then `bazel test
    --config=remote` of the C++ app: a dict of the two processes and the spawns of
    their execution logs."""
    logs = tmp_path_factory.mktemp("remote-execution")
    bazel = remote.bazel(remote.clone, "remote-execution")
    flags = remote.remote_execution_flags()
    try:
        build = bazel.build(*MODEL_TARGETS, *flags, f"--execution_log_json_file={logs / 'build.json'}")
        test = bazel.test(CPP_APP_TEST, *flags, f"--execution_log_json_file={logs / 'test.json'}")
    finally:
        bazel.shutdown()  # the logs are all the tests need
    return {
        "build": build,
        "test": test,
        "build_spawns": read_execution_log(logs / "build.json"),
        "test_spawns": read_execution_log(logs / "test.json"),
    }
