"""Test-wide set-up: import paths and the hypothesis profile.

Nothing here seeds global random state: tests that need randomness seed their
own generators (``np.random.default_rng(seed)``, ``torch.Generator``), so a test
passes or fails the same way whatever ran before it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

REPO_ROOT = Path(__file__).resolve().parent.parent

# `import cuvil` without installing the package, and `import examples.models`.
for path in (REPO_ROOT, REPO_ROOT / "compiler"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

settings.register_profile("ci", deadline=None, max_examples=25, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def run_as_own_step(config, items, folder: Path, env_var: str, marker: str, reason: str) -> None:
    """Mark the tests under `folder` with `marker` and skip them (with `reason`) unless the
    folder was named on the command line or `env_var`=1: slow suites that .ci/run runs
    as steps of their own."""
    explicit = os.environ.get(env_var) == "1" or any(
        folder == p or folder in p.parents for p in (Path(a.split("::", 1)[0]).resolve() for a in config.args))
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if folder in Path(str(item.fspath)).resolve().parents:
            item.add_marker(getattr(pytest.mark, marker))
            if not explicit:
                item.add_marker(skip)
