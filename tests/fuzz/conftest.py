"""Fuzzing and sanitizers (issue 33). They take minutes, so they run as their own step
of .ci/run:

    pytest -q -s tests/fuzz          (or CUVIL_FUZZ_TESTS=1 with any other selection)

and are skipped, with that reason, when pytest collects them as part of `pytest tests`.
CUVIL_FUZZ_SECONDS (default 45) is each libFuzzer harness's time.
"""
from __future__ import annotations

from pathlib import Path

from tests.conftest import run_as_own_step

HERE = Path(__file__).resolve().parent


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: fuzzing and sanitizer runs; run with `pytest tests/fuzz`")


def pytest_collection_modifyitems(config, items):
    run_as_own_step(config, items, HERE, "CUVIL_FUZZ_TESTS", "fuzz",
                    "fuzzing runs as its own step: pytest tests/fuzz")
