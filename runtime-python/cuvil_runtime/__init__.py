"""cuvil_runtime: call a model built by Cuvil (`lib<name>.so`) from Python.

    model = cuvil_runtime.load("libmlp.so")
    (y,) = model(x)                      # thread-safe: contexts come from a pool
    with model.context(threads=2) as ctx:
        (y,) = ctx.run(x=x)              # a context of one's own

Needs NumPy only. The model's inputs, outputs and symbolic dims come from the
library's C API (`<name>_model_desc()`); inputs are checked in Python (count, name,
shape, dtype, symbolic dims within their bounds and equal across inputs) and a bad one
raises `InputError` naming it.
"""
from __future__ import annotations

import os

from ._abi import ABI_VERSION
from ._model import Context, CuvilRuntimeError, InputError, Model, TensorInfo

__all__ = ["ABI_VERSION", "Context", "CuvilRuntimeError", "InputError", "Model", "TensorInfo", "load"]
__version__ = "0.2.0"


def load(path: str | os.PathLike, prefix: str | None = None, threads: int = 1, *, lib=None) -> Model:
    """Load the shared library at `path` (built with `cuvil build --kind shared`).

    `prefix` is the model's name (its config's `model.name`); by default it is read
    from the model's ABI signature in the library. `threads`: threads per call.
    `lib`: the library already loaded (a ctypes.CDLL; `path` then only names it)."""
    return Model(path, prefix, threads, lib=lib)
