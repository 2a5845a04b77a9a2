"""The build cache: completed stage outputs in `<cache>/<stage>/<key>/`, keyed by the
hash of everything a stage's output depends on.

Entries are written to a temporary directory that is renamed into place when complete,
so an interrupted build leaves the cache valid.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from .fsutil import make_temp

CACHE_FORMAT = "1"
_PKG = Path(__file__).resolve().parent


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_key(*parts) -> str:
    """A cache key: the hash of `parts` as JSON with sorted keys."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def tree_hash(root: Path, patterns: tuple[str, ...]) -> str:
    """Hash of the names and contents of the files under root matching patterns."""
    h = hashlib.sha256()
    for p in sorted(q for pat in patterns for q in root.rglob(pat)):
        if "__pycache__" in p.parts:
            continue
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def compiler_hash() -> str:
    """Everything the compile stage's output depends on in Cuvil itself."""
    return tree_hash(_PKG, ("*.py",))


class Cache:
    """Completed stage outputs by key; `get_or_make` builds missing entries atomically."""

    def __init__(self, root: Path, log: Callable[[str], None] = print):
        self.root = Path(root)
        self.log = log

    def entry(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def get_or_make(self, stage: str, key: str, make: Callable[[Path], None],
                    valid: Callable[[Path], bool] = lambda p: True) -> tuple[Path, bool]:
        final = self.entry(stage, key)
        if final.is_dir() and valid(final):
            self.log(f"[{stage}] cached ({key[:12]})")
            return final, True
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = make_temp(final.parent, is_dir=True)  # cleans a killed build's leftovers first
        start = time.monotonic()
        try:
            make(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        self.log(f"[{stage}] done in {time.monotonic() - start:.1f}s ({key[:12]})")
        return final, False
