"""A loaded model (`Model`) and its contexts (`Context`)."""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Iterator, Union

import numpy as np

from . import _abi


class CuvilRuntimeError(RuntimeError):
    """A call into the C runtime failed; `status` is its cuvil_status code (0 if none)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class InputError(CuvilRuntimeError, ValueError):
    """An input the model cannot take (count, name, shape, dtype or a symbolic dim's
    bounds); `input` names it (None when the call's input count is wrong)."""

    def __init__(self, message: str, input: str | None = None):
        super().__init__(message, 0)
        self.input = input


Dim = Union[int, str]


@dataclass(frozen=True)
class TensorInfo:
    """An input or output: its name, NumPy dtype and shape. Input dims are ints or the
    name of a symbolic dim; output shapes are at the upper bounds of the symbolic dims."""
    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(map(str, self.shape))}]"


def _tensors(descs, n: int) -> list[_abi.TensorDesc]:
    return [descs[i] for i in range(n)]


class Model:
    """A model in a shared library built by Cuvil. Calling it runs one inference on a
    context (arena) taken from a pool, so any number of Python threads may call it at
    once; `context()` gives a context of one's own. See `load`."""

    def __init__(self, path: str | os.PathLike, prefix: str | None = None, threads: int = 1, *,
                 lib: ctypes.CDLL | None = None):
        self.path = os.fspath(path)
        if lib is None and not os.path.isfile(self.path):
            raise CuvilRuntimeError(f"{self.path}: no such file")
        if prefix is None:
            prefix = _prefix_of(self.path)
        try:
            self._lib = lib if lib is not None else ctypes.CDLL(os.path.abspath(self.path))
            _abi.bind(self._lib, prefix)
        except OSError as e:
            raise CuvilRuntimeError(f"{self.path}: cannot load it as a Cuvil model '{prefix}': {e}") from None
        except AttributeError as e:
            raise CuvilRuntimeError(f"{self.path}: not a Cuvil shared library of model '{prefix}' ({e})") from None
        desc = getattr(self._lib, f"{prefix}_model_desc")()
        if not desc or desc.contents.abi_version != _abi.ABI_VERSION:
            got = desc.contents.abi_version if desc else None
            raise CuvilRuntimeError(f"{self.path}: model '{prefix}' has Cuvil ABI {got}; this cuvil_runtime "
                                    f"reads ABI {_abi.ABI_VERSION}: rebuild the model or use its cuvil-runtime")
        self._desc = d = desc.contents
        self.name = prefix
        self.arena_size = int(d.arena_size)
        self.signature = d.signature.decode("ascii", "replace") if d.signature else None
        dims = [d.dims[k] for k in range(d.n_dims)]
        self.dims: dict[str, tuple[int, int]] = {x.name.decode(): (int(x.min), int(x.max)) for x in dims}
        self._dim_names = [x.name.decode() for x in dims]
        ins, outs = _tensors(d.inputs, d.n_inputs), _tensors(d.outputs, d.n_outputs)
        symbols = iter([d.input_dim_symbols[k] for k in range(sum(t.rank for t in ins))] if dims else [])
        self.inputs = [TensorInfo(t.name.decode(), _dtype(t.dtype, self.path),
                                  tuple(self._dim(next(symbols, -1), t.shape[k]) for k in range(t.rank)))
                       for t in ins]
        self.outputs = [TensorInfo(t.name.decode(), _dtype(t.dtype, self.path),
                                   tuple(int(t.shape[k]) for k in range(t.rank))) for t in outs]
        given = {s for t in self.inputs for s in t.shape if isinstance(s, str)}
        # dims no input gives: sizes a run produces (outputs are cut to them)
        self.produced = [s for s in self._dim_names if s not in given]
        self._fn = {name: getattr(self._lib, f"{prefix}_{name}")
                    for name in ("create", "destroy", "set_threads", "set_input_shape", "run")}
        self._pool_lock = threading.Lock()
        self._free: list[Context] = []
        self.threads = 1
        self.set_threads(threads)

    def _dim(self, symbol: int, value: int) -> Dim:
        return self._dim_names[symbol] if symbol >= 0 else int(value)

    def __repr__(self) -> str:
        dims = "".join(f", {n} in [{lo}, {hi}]" for n, (lo, hi) in self.dims.items())
        return (f"<cuvil_runtime.Model {self.name!r} inputs=[{'; '.join(map(str, self.inputs))}] "
                f"outputs=[{'; '.join(map(str, self.outputs))}]{dims}>")

    def _error(self, status: int, what: str) -> CuvilRuntimeError:
        detail = self._lib.cuvil_last_error().decode("utf-8", "replace")
        sentence = self._lib.cuvil_status_message(status).decode("utf-8", "replace")
        return CuvilRuntimeError(f"model {self.name!r}: {what} failed ({sentence}): {detail}", status)

    def context(self, threads: int | None = None) -> "Context":
        """A new context: its own arena and shapes, for one thread at a time."""
        return Context(self, self.threads if threads is None else threads)

    def set_threads(self, threads: int) -> None:
        """Threads for each call of the model (applied to pooled contexts as they are taken)."""
        _check_threads(threads)
        with self._pool_lock:
            self.threads = threads
        self._give(self._take())  # one context exists from the start: creation errors surface here

    def _take(self) -> "Context":
        with self._pool_lock:
            ctx, threads = (self._free.pop() if self._free else None), self.threads
        if ctx is None:
            ctx = Context(self, threads)
        elif ctx.threads != threads:
            ctx.set_threads(threads)
        return ctx

    def _give(self, ctx: "Context") -> None:
        with self._pool_lock:
            self._free.append(ctx)

    @contextlib.contextmanager
    def pooled(self) -> Iterator["Context"]:
        """A context from the pool, for the caller alone until the block ends."""
        ctx = self._take()
        try:
            yield ctx
        finally:
            self._give(ctx)

    def __call__(self, *arrays, **named) -> tuple[np.ndarray, ...]:
        """One run: inputs in order or by name; returns the outputs in order."""
        with self.pooled() as ctx:
            return ctx.run(*arrays, **named)

    run = __call__

    def bind(self, arrays, named) -> tuple[list[np.ndarray], dict[str, int]]:
        """The inputs as C-contiguous arrays of the model's dtypes and the values of the
        symbolic dims their shapes give; InputError naming the input otherwise."""
        names = [t.name for t in self.inputs]
        unknown = sorted(set(named) - set(names))
        if unknown:
            raise InputError(f"model {self.name!r} has no input {unknown[0]!r} (inputs: {', '.join(names)})",
                             unknown[0])
        if len(arrays) > len(names):
            raise InputError(f"model {self.name!r} takes {len(names)} inputs ({', '.join(names)}), got {len(arrays)}")
        values = list(arrays) + [named.get(n) for n in names[len(arrays):]]
        for n, a in zip(names, arrays):
            if n in named:
                raise InputError(f"input {n!r} is given twice (by position and by name)", n)
        missing = [n for n, v in zip(names, values) if v is None]
        if missing:
            raise InputError(f"model {self.name!r}: input {missing[0]!r} is missing (inputs: {', '.join(names)})",
                             missing[0])
        ins, env, where = [], {}, {}
        for t, a in zip(self.inputs, values):
            a = np.asarray(a)
            if a.ndim != len(t.shape):
                raise InputError(f"input {t.name!r}: expected shape {_fmt(t.shape)} ({len(t.shape)} dims), "
                                 f"got {list(a.shape)}", t.name)
            for d, n in zip(t.shape, a.shape):
                if isinstance(d, int):
                    if d != n:
                        raise InputError(f"input {t.name!r}: expected shape {_fmt(t.shape)}, got {list(a.shape)}",
                                         t.name)
                    continue
                lo, hi = self.dims[d]
                if not lo <= n <= hi:
                    raise InputError(f"input {t.name!r}: {d} = {n} is outside its bounds [{lo}, {hi}] "
                                     f"(shape {list(a.shape)}, declared {_fmt(t.shape)})", t.name)
                if env.setdefault(d, n) != n:
                    raise InputError(f"input {t.name!r}: {d} = {n} here but {env[d]} in input {where[d]!r}", t.name)
                where.setdefault(d, t.name)
            if a.dtype != t.dtype:
                if not np.can_cast(a.dtype, t.dtype, casting="same_kind"):
                    raise InputError(f"input {t.name!r}: expected dtype {t.dtype}, got {a.dtype}", t.name)
                a = a.astype(t.dtype)
            ins.append(a if a.flags.c_contiguous else a.copy(order="C"))  # (ascontiguousarray makes 0-d 1-d)
        return ins, env


class Context:
    """One arena and one set of shapes: run it from one thread at a time (the C runtime
    refuses a second concurrent run with CUVIL_ERR_BUSY). Closed with `close()`, a
    `with` block or when collected."""

    def __init__(self, model: Model, threads: int = 1):
        self.model = model
        self._ptr = ctypes.c_void_p()
        self._destroy = model._fn["destroy"]  # kept for __del__ at interpreter exit
        status = model._fn["create"](ctypes.byref(self._ptr))
        if status != 0:
            raise model._error(status, "create")
        self.threads = 1
        self.set_threads(threads)

    def set_threads(self, threads: int) -> None:
        """Threads for this context's runs (the C runtime clamps to 256)."""
        _check_threads(threads)
        self._call("set_threads", threads)
        self.threads = threads

    def _call(self, name: str, *args) -> None:
        if not self._ptr:
            raise CuvilRuntimeError(f"model {self.model.name!r}: the context is closed")
        status = self.model._fn[name](self._ptr, *args)
        if status != 0:
            raise self.model._error(status, name)

    def run(self, *arrays, **named) -> tuple[np.ndarray, ...]:
        """One run on this context: inputs in order or by name; returns the outputs."""
        m = self.model
        ins, _ = m.bind(arrays, named)
        if m.dims:
            for i, a in enumerate(ins):
                dims = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
                self._call("set_input_shape", i, dims, a.ndim)
        outs = [np.empty(self._shape(i) if m.dims else t.shape, t.dtype) for i, t in enumerate(m.outputs)]
        in_ptrs = (ctypes.c_void_p * max(len(ins), 1))(*[a.ctypes.data for a in ins])
        out_ptrs = (ctypes.c_void_p * max(len(outs), 1))(*[o.ctypes.data for o in outs])
        self._call("run", in_ptrs, out_ptrs)
        if m.produced:  # data-dependent sizes: the leading elements of each buffer
            outs = [_cut(o, self._shape(i)) for i, o in enumerate(outs)]
        return tuple(outs)

    def run_pointers(self, inputs, outputs) -> None:
        """A run on caller-owned memory, unchecked: `inputs` and `outputs` are ctypes
        arrays of pointers to C-contiguous tensors in manifest order, of the model's
        shapes (symbolic dims: of the shapes set last)."""
        self._call("run", inputs, outputs)

    def _shape(self, i: int) -> tuple[int, ...]:
        """Output i's shape for this context's current input shapes (or last run)."""
        t = self.model._lib.cuvil_ctx_tensor(self._ptr, 1, i)
        return tuple(int(t.contents.shape[k]) for k in range(t.contents.rank))

    def close(self) -> None:
        if self._ptr:
            self._destroy(self._ptr)
            self._ptr = ctypes.c_void_p()

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_ptr", None):
            self.close()


def _cut(buf: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if buf.shape == shape:
        return buf
    return buf.reshape(-1)[:int(np.prod(shape, dtype=np.int64))].reshape(shape).copy()


def _fmt(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _check_threads(threads) -> None:
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")


def _dtype(code: int, path: str) -> np.dtype:
    if code not in _abi.DTYPES:
        raise CuvilRuntimeError(f"{path}: a tensor has dtype code {code}, which this cuvil_runtime does not know")
    return _abi.DTYPES[code]


def _prefix_of(path: str) -> str:
    found = _abi.model_signatures(path)
    names = sorted({f["name"] for f in found})
    if len(names) != 1:
        what = "no Cuvil model signature" if not names else f"the models {', '.join(names)}"
        raise CuvilRuntimeError(f"{path}: holds {what}; pass prefix= (the model's name in its config)")
    return names[0]
