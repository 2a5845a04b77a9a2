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

import os
from pathlib import Path

import pytest

from tests.conftest import run_as_own_step

from bazel_helpers import Bazel

HERE = Path(__file__).resolve().parent


def pytest_configure(config):
    config.addinivalue_line("markers", "bazel: drives Bazel; run with `pytest tests/bazel`")


def pytest_collection_modifyitems(config, items):
    run_as_own_step(config, items, HERE, "CUVIL_BAZEL_TESTS", "bazel", "Bazel tests run as their own step: pytest tests/bazel")


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
