"""Atomic file output: a temporary file in the target's directory, renamed into place,
so a reader sees the old file or the complete new one, never half of one."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, data: bytes | str | Iterable[bytes]) -> None:
    """Write `data` (bytes, text, or an iterable of byte chunks) to `path` atomically,
    with the permissions a plain `open(path, "w")` would give."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, str):
                f.write(data.encode())
            elif isinstance(data, (bytes, bytearray, memoryview)):
                f.write(data)
            else:
                for chunk in data:
                    f.write(chunk)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
