"""Test-wide set-up: import paths and the hypothesis profile.

Nothing here seeds global random state: tests that need randomness seed their
own generators (``np.random.default_rng(seed)``, ``torch.Generator``), so a test
passes or fails the same way whatever ran before it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import settings

REPO_ROOT = Path(__file__).resolve().parent.parent

# `import cuvil` without installing the package, and `import examples.models`.
for path in (REPO_ROOT, REPO_ROOT / "compiler"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

settings.register_profile("ci", deadline=None, max_examples=25, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
