"""Link objects and C sources into a host shared library with the C compiler."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cuvil.errors import LinkError

_BASE_FLAGS = ("-shared", "-fPIC", "-O2")
_LIBS = ("-lm", "-lpthread")


def link_shared(
    objects: Sequence[str | os.PathLike],
    c_sources: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    cc: str = "cc",
    extra_flags: Sequence[str] = (),
) -> Path:
    """Compile `c_sources` and link them with `objects` into the shared library `out`.

    The library is written to a temporary file next to `out` and renamed into
    place, so `out` is either the old file or the complete new one. Raises
    `LinkError` (with the compiler's command line and stderr) on failure.
    """
    out = Path(out)
    inputs = [str(Path(p)) for p in (*objects, *c_sources)]
    if not inputs:
        raise LinkError(f"nothing to link into {out}: no objects and no C sources given")
    for path in inputs:
        if not Path(path).is_file():
            raise LinkError(f"cannot link {out}: input {path} does not exist")

    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    cmd = [cc, *_BASE_FLAGS, *extra_flags, "-o", tmp_name, *inputs, *_LIBS]
    try:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise LinkError(f"cannot run the C compiler {cc!r} to link {out}: {exc}") from exc
        if proc.returncode != 0:
            raise LinkError(
                f"linking {out} failed (exit {proc.returncode}):\n  {' '.join(cmd)}\n"
                f"{proc.stderr.strip()}"
            )
        os.chmod(tmp_name, 0o755)
        os.replace(tmp_name, out)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return out
