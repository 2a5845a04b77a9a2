"""Files: atomic output (a temporary file in the target's directory, renamed into place, so
a reader sees the old file or the complete new one, never half of one), the temporary
names every writer uses, the cleaning of those a killed process left, and bounded reads
of regular files.

Temporary names are `.cuvil-PPPPPPPP-RRRRRR.tmp` (the writer's process id in hex, six
random characters): short and of fixed length, so any legal output name works, and a
later writer in the same directory can tell a dead process's leftovers (the executable's
runtime uses the same names) from a live one's.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import time
from pathlib import Path
from typing import Iterable

from .errors import CuvilError

TEMP_RE = re.compile(r"^\.cuvil-([0-9a-f]{8})-[0-9a-z]{6}\.tmp$")
STALE_AGE_S = 24 * 3600  # a temp name of a live process id older than this is stale too (reused id)
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def temp_name() -> str:
    """A fresh temporary name for this process (fixed length, 26 characters)."""
    return f".cuvil-{os.getpid() & 0xFFFFFFFF:08x}-{''.join(secrets.choice(_ALPHABET) for _ in range(6))}.tmp"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def clean_stale(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files and directories in `directory` that a dead process
    left (or that are older than STALE_AGE_S); the paths removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        m = TEMP_RE.match(name)
        if m is None:
            continue
        pid, path = int(m.group(1), 16), Path(directory, name)
        try:
            st = path.lstat()
        except OSError:
            continue
        if pid == os.getpid() or (_alive(pid) and now - st.st_mtime < STALE_AGE_S):
            continue
        try:
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
        except OSError:
            pass  # another process cleaned it first, or it is not ours to remove
    return removed


def make_temp(directory: Path, is_dir: bool = False) -> Path:
    """Create a new temporary file (mode 0600) or directory in `directory`, after
    removing the stale ones there."""
    clean_stale(directory)
    for _ in range(100):
        path = directory / temp_name()
        try:
            if is_dir:
                path.mkdir(mode=0o700)
            else:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return path
        except FileExistsError:
            continue
    raise CuvilError(f"{directory}: cannot create a temporary name")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, data: bytes | str | Iterable[bytes]) -> None:
    """Write `data` (bytes, text, or an iterable of byte chunks) to `path` atomically,
    with the permissions a plain `open(path, "w")` would give."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp(path.parent)
    try:
        with open(tmp, "wb") as f:
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


def atomic_copy(src: Path, dst: Path) -> None:
    """Copy `src` (contents and mode) to `dst` atomically."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp(dst.parent)
    try:
        shutil.copyfile(src, tmp)
        shutil.copymode(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_regular(path: str | os.PathLike, limit: int, what: str = "file",
                 error: type[CuvilError] = CuvilError) -> bytearray:
    """The bytes of `path` if it is a regular file of at most `limit` bytes; otherwise
    `error` with one line. Never blocks on a FIFO, never reads a device; one buffer of
    the file's size (no second copy)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror}") from None
    try:
        size = _check_stat(path, os.fstat(fd), limit, what, error)
    except BaseException:
        os.close(fd)
        raise
    try:
        with os.fdopen(fd, "rb", buffering=0) as f:
            buf = bytearray(size)
            view, got = memoryview(buf), 0
            while got < size:
                n = f.readinto(view[got:])
                if not n:
                    raise error(f"{path}: the {what} shrank while read")
                got += n
            view.release()
            if f.read(1):
                raise error(f"{path}: the {what} grew while read")
            return buf
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror}") from None


def _check_stat(path, st: os.stat_result, limit: int, what: str, error: type[CuvilError]) -> int:
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: the {what} is {'a directory' if stat.S_ISDIR(st.st_mode) else 'not a regular file'}")
    if st.st_size > limit:
        raise error(f"{path}: the {what} has {st.st_size} bytes, more than the limit of {limit}")
    return st.st_size


def check_regular(path: str | os.PathLike, limit: int, what: str = "file",
                  error: type[CuvilError] = CuvilError) -> int:
    """The size of `path` if it is a regular file of at most `limit` bytes (for readers
    that open it themselves); otherwise `error` with one line."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror}") from None
    return _check_stat(path, st, limit, what, error)
