"""The Python API: `cuvil.compile`, `cuvil.capture`, `cuvil.load_ir`.

`compile` runs the same three stages as the deployed artifacts (capture -> compile ->
link): the generated object and the weights object are linked into a shared library and
loaded in-process, so its numbers and speed are the product's.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .errors import CuvilError
from .ir import Module, read_bundle, write_bundle
from .ir.types import TensorType
from .options import CompileOptions, Quantization

if TYPE_CHECKING:
    from .backend.llvm.target import Target


def capture(module, example_inputs: Sequence, path: str | os.PathLike) -> Module:
    """Capture a framework model (PyTorch) into a framework-free .cvir bundle at `path`."""
    ir_module = _to_ir(module, example_inputs)
    write_bundle(ir_module, path)
    return ir_module


def load_ir(path: str | os.PathLike) -> Module:
    """Read a .cvir bundle written by `capture`."""
    return read_bundle(path)


def _to_ir(module, example_inputs, dynamic_shapes=None, dim_bounds=None) -> Module:
    from .frontends.onnx import capture_onnx, is_onnx_model
    for name, b in (dim_bounds or {}).items():
        ok = isinstance(b, (tuple, list)) and len(b) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                 for v in b)
        if not ok or not 1 <= b[0] <= b[1]:
            raise CuvilError(f"dim_bounds[{name!r}] must be (min, max) integers with 1 <= min <= max, got {b!r}")
    if dynamic_shapes is not None or dim_bounds:
        if is_onnx_model(module) and dynamic_shapes is None and dim_bounds:
            # ONNX: the model's own dim_params name the symbolic dims
            return capture_onnx(module, example_inputs, dim_bounds=dim_bounds)
        if dynamic_shapes is None or not dim_bounds:
            raise CuvilError("symbolic dims need both dynamic_shapes (the dim names per input) and "
                             "dim_bounds ({name: (min, max)}); ONNX models need only dim_bounds for their dim_params")
        if isinstance(module, Module) or not _is_torch(module):
            raise CuvilError("dynamic_shapes is supported for PyTorch models (capture with torch.export); "
                             "ONNX models take dim_bounds for their dim_params")
    if isinstance(module, Module):
        return module
    if isinstance(module, (str, os.PathLike)) and str(module).endswith(".cvir"):
        return read_bundle(module)
    from .frontends.tf import capture_tf, is_tensorflow_model
    if is_onnx_model(module):  # an onnx.ModelProto or a .onnx path
        return capture_onnx(module, example_inputs)
    if is_tensorflow_model(module):  # Keras model, tf.function, concrete function, SavedModel dir
        return capture_tf(module, example_inputs)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of the test setup
        torch = None
    if torch is not None and (isinstance(module, torch.nn.Module) or callable(module)):
        from .frontends.torch import capture_torch
        if not isinstance(module, torch.nn.Module):
            module = _FunctionModule(module)
        return capture_torch(module, example_inputs, dynamic_shapes=dynamic_shapes, dim_bounds=dim_bounds)
    raise CuvilError(f"cannot compile a {type(module).__name__}: pass a torch.nn.Module, a Keras model "
                     "or tf.function, an ONNX model or .onnx path, a cuvil.ir.Module or a .cvir path")


def _is_torch(module) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    from .frontends.onnx import is_onnx_model
    from .frontends.tf import is_tensorflow_model
    return not is_onnx_model(module) and not is_tensorflow_model(module) and \
        (isinstance(module, torch.nn.Module) or callable(module))


def _FunctionModule(fn):
    import torch

    class Wrapped(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)
    return Wrapped()


def compile(module, example_inputs: Sequence = (), *, quantization: str | Quantization = "none",
            threads: int = 1, target: Target | str | None = None, prefix: str = "cuvil_model",
            jit: bool = False, profile: bool = False, dynamic_shapes: Sequence | None = None,
            dim_bounds: dict | None = None, specialize: Sequence[dict] = ()) -> "CompiledModel":
    """Capture (if needed), optimise, generate native code, link it and load it.

    The object is linked with the C runtime into a shared library exactly as
    `cuvil link --kind shared` does, and called through the generated C API
    (`<prefix>_create` / `_run` / `_set_threads`). With `jit=True` the same LLVM IR is
    JIT-compiled in-process instead (for tests; runs serially). With `profile=True`
    every kernel call is timed (cycle counter); `CompiledModel.profile()` reports it.
    `target`: a backend.llvm.target.Target or a target name (`resolve_target`; default:
    this machine).

    `quantization` is a method name (none, fp16, int4_block, int8_sym) or a
    `cuvil.options.Quantization` with its other settings:

        Quantization("int8_sym", calibration=[(x0,), (x1,)], keep_f32=2)
        Quantization(precision="bf16")
        Quantization("int8_sym", qat=True)

    "int8_sym" needs `calibration`: input tuples (NumPy arrays, shaped like
    example_inputs) that the interpreter runs to find activation ranges (with
    "int4_block", optional: matmul codes are then fitted GPTQ-style to the calibrated
    inputs); `activation` ("u8" | "i8"), `ranges` ("minmax" | "percentile"),
    `percentile` and `keep_f32` tune it. `precision="bf16"` (method none) runs
    convolutions and matrix products with constant weights in bfloat16 with f32
    accumulation (AVX-512-BF16 where the target has it), weights stored as bf16.

    Symbolic dims (PyTorch models; ONNX models need only `dim_bounds` for their
    dim_params): `dynamic_shapes` names the dims per input
    (`[("batch", "seq_len"), ("batch", "seq_len")]`; ints or None for static dims, None
    for a static input) and `dim_bounds` bounds each name (`{"batch": (1, 32)}`). The
    compiled model then takes any shape within the bounds; its arena is sized for the
    upper bounds. `specialize` (`[{"seq_len": 128}]`) also compiles the code for those
    values with the dims fixed; runs with matching shapes take it.

    A pre-quantized model (PT2E: `prepare_pt2e`, calibrate or train, `convert_pt2e`) keeps
    its own int8 weights and activation scales whatever `quantization` says; with
    `Quantization(qat=True)` (method none or int8_sym, no calibration) a model without
    such nodes is an error."""
    from .backend.llvm.codegen import generate
    from .backend.llvm.target import compile_to_object, host_target, resolve_target
    from .backend.llvm.weights import weights_object
    from .build import make_manifest, signature_ir
    from .native import link_artifact
    from .passes.pipeline import optimise

    q = Quantization.of(quantization)
    if q.needs_calibration and not q.has_calibration:
        raise CuvilError("quantization 'int8_sym' needs calibration for the activation ranges: "
                         "quantization=Quantization('int8_sym', calibration=[input tuples])")
    opts = CompileOptions(name=prefix, quantization=q, threads=threads, specialize=tuple(specialize))
    ir_module = _to_ir(module, example_inputs, dynamic_shapes, dim_bounds)
    target = resolve_target(target) if isinstance(target, str) else target or host_target()
    optimise(ir_module, opts, target)
    gen = generate(ir_module, prefix, profile=profile, specialize=opts.specialize)
    if jit:
        from .backend.llvm.jit import JitEngine
        engine = JitEngine(gen, target)
        return _JitModel(engine, gen, ir_module)
    manifest = make_manifest(gen, target, threads)
    with tempfile.TemporaryDirectory(prefix="cuvil-") as tmp:
        paths = [Path(tmp, f"{prefix}.o"), Path(tmp, f"{prefix}.weights.o")]
        paths[0].write_bytes(compile_to_object(gen.llvm_ir + signature_ir(prefix, target.triple), target))
        paths[1].write_bytes(weights_object(f"{prefix}_weights", gen.weights, target))
        so = link_artifact("shared", paths, manifest, None, Path(tmp, f"lib{prefix}.so"))
        lib = ctypes.CDLL(str(so))  # the mapping survives the directory's removal
    return CompiledModel(lib, gen, ir_module, threads)


@contextlib.contextmanager
def _runtime_errors():
    """cuvil_runtime's exceptions as CuvilError (same message)."""
    import cuvil_runtime
    try:
        yield
    except cuvil_runtime.CuvilRuntimeError as e:
        raise CuvilError(str(e)) from None


class CompiledModel:
    """A compiled model loaded in-process. Call it with NumPy arrays; returns a tuple.

    Built on the runtime-only package `cuvil_runtime` (runtime-python/), which owns the
    contexts, shapes and runs; this class adds the compiler's view (TensorTypes, the IR,
    the profile). Safe to call from any number of threads: each call takes a context
    (arena) of its own from a pool (one is created when all are in use), sets its
    shapes, runs and gives it back, so concurrent calls never share an arena or a shape."""

    def __init__(self, lib, gen, ir_module: Module, threads: int = 1):
        import cuvil_runtime
        self._lib = lib
        p = gen.prefix
        self.inputs: list[tuple[str, TensorType]] = gen.inputs
        self.outputs: list[tuple[str, TensorType]] = gen.outputs
        self.arena_size = gen.arena_size
        self.kernel_count = gen.kernels
        self.ir = ir_module
        self.symbols = [name for name, _, _ in gen.symbols]
        self.bounds = {name: (lo, hi) for name, lo, hi in gen.symbols}
        self._prefix = p
        self._profile_ops = gen.profile_ops
        with _runtime_errors():
            self._runtime = cuvil_runtime.load(lib._name, prefix=p, lib=lib)
        self.produced = self._runtime.produced  # sizes the run produces (ir/ops/dynamic.py)
        self.threads = 1
        self.set_threads(threads)

    def set_threads(self, threads: int) -> None:
        """Threads for each call (applied to every context as it is next taken)."""
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise CuvilError(f"threads must be a positive integer, got {threads!r}")
        with _runtime_errors():
            self._runtime.set_threads(threads)
        self.threads = threads

    def _invoke(self, in_ptrs, out_ptrs) -> None:
        """A run on caller-owned buffers of the model's shapes (static shapes), unchecked."""
        with _runtime_errors(), self._runtime.pooled() as ctx:
            ctx.run_pointers(in_ptrs, out_ptrs)

    def profile(self, reset: bool = True) -> list[tuple[str, str, str, int]]:
        """(op, source location, result type, cycles) per kernel call since the last reset,
        most expensive first. Needs `cuvil.compile(..., profile=True)`."""
        if not self._profile_ops:
            raise CuvilError("compile with profile=True to profile")
        counters = (ctypes.c_int64 * len(self._profile_ops)).in_dll(self._lib, f"{self._prefix}_profile")
        rows = [(*info, int(c)) for info, c in zip(self._profile_ops, counters)]
        if reset:
            ctypes.memset(counters, 0, ctypes.sizeof(counters))
        return sorted(rows, key=lambda r: -r[3])

    def _bind(self, arrays) -> tuple[list[np.ndarray], dict[str, int]]:
        """The inputs as contiguous arrays of the model's dtypes, and the values of the
        symbolic dims their shapes give (checked against the bounds)."""
        if len(arrays) != len(self.inputs):
            raise CuvilError(f"model takes {len(self.inputs)} inputs "
                             f"({', '.join(n for n, _ in self.inputs)}), got {len(arrays)}")
        ins, env = [], {}
        for (name, t), a in zip(self.inputs, arrays):
            if hasattr(a, "detach"):  # a torch tensor
                a = a.detach().cpu().numpy()
            a = np.asarray(a)
            ok = a.ndim == t.rank
            for d, n in zip(t.shape, a.shape) if ok else ():
                if isinstance(d, int):
                    ok = ok and d == n
                elif env.setdefault(d, n) != n:
                    raise CuvilError(f"input {name!r}: {d} is {n} here but {env[d]} in an earlier input")
                else:
                    lo, hi = self.bounds[d]
                    if not lo <= n <= hi:
                        raise CuvilError(f"input {name!r}: {d} = {n} is outside its bounds [{lo}, {hi}] "
                                         f"(shape {list(a.shape)}, declared {list(t.shape)})")
            if not ok:
                raise CuvilError(f"input {name!r}: expected shape {list(t.shape)}, got {list(a.shape)}")
            if a.dtype != t.np_dtype:
                if np.can_cast(a.dtype, t.np_dtype, casting="same_kind"):
                    a = a.astype(t.np_dtype)
                else:
                    raise CuvilError(f"input {name!r}: expected dtype {t.dtype}, got {a.dtype}")
            ins.append(a if a.flags.c_contiguous else a.copy(order="C"))  # 0-d stays 0-d
        return ins, env

    def __call__(self, *arrays) -> tuple[np.ndarray, ...]:
        ins, _ = self._bind(arrays)
        with _runtime_errors(), self._runtime.pooled() as ctx:
            return ctx.run(*ins)


class _JitModel(CompiledModel):
    """The JIT path: the same call interface over the JIT'd forward function."""

    def __init__(self, engine, gen, ir_module: Module):
        self._lib = engine
        self.inputs, self.outputs = gen.inputs, gen.outputs
        self.arena_size, self.kernel_count, self.ir = gen.arena_size, gen.kernels, ir_module
        self.symbols = [name for name, _, _ in gen.symbols]
        self.bounds = {name: (lo, hi) for name, lo, hi in gen.symbols}
        self.produced = _produced(gen)
        self.threads = 1
        self._arena = _aligned_empty(max(self.arena_size, 64))
        self._forward = engine.forward
        self._profile_ops = []
        self._call_lock = threading.Lock()

    def set_threads(self, threads: int) -> None:
        raise CuvilError("the JIT path runs single-threaded")

    def _buffers(self, env) -> list[np.ndarray]:
        """Output buffers for this call: data-dependent sizes at their upper bounds."""
        env = {**env, **{s: self.bounds[s][1] for s in self.produced}}
        return [np.empty(t.at(env).shape, t.np_dtype) for _, t in self.outputs]

    @staticmethod
    def _cut(buf: np.ndarray, shape) -> np.ndarray:
        """The run's result at its produced size: the leading elements of the buffer."""
        shape = tuple(int(d) for d in shape)
        return buf if buf.shape == shape else buf.reshape(-1)[:int(np.prod(shape))].reshape(shape).copy()

    def __call__(self, *arrays) -> tuple[np.ndarray, ...]:
        """One call at a time (the JIT'd code has one arena): concurrent calls wait."""
        ins, env = self._bind(arrays)
        outs = self._buffers(env)
        env.update({s: self.bounds[s][1] for s in self.produced})
        in_ptrs = (ctypes.c_void_p * max(len(ins), 1))(*[a.ctypes.data for a in ins])
        out_ptrs = (ctypes.c_void_p * max(len(outs), 1))(*[o.ctypes.data for o in outs])
        dims = (ctypes.c_int64 * len(self.symbols))(*[env[s] for s in self.symbols]) if self.symbols else None
        self._invoke(in_ptrs, out_ptrs, dims)
        if self.produced:  # the sizes the run stored into dims
            env = dict(zip(self.symbols, dims))
            outs = [self._cut(o, t.at(env).shape) for o, (_, t) in zip(outs, self.outputs)]
        return tuple(outs)

    def _invoke(self, in_ptrs, out_ptrs, dims=None) -> None:
        with self._call_lock:
            if dims is not None:
                self._forward(in_ptrs, out_ptrs, self._arena.ctypes.data, dims)
            else:
                self._forward(in_ptrs, out_ptrs, self._arena.ctypes.data)


def _produced(gen) -> list[str]:
    """The symbols no input's shape gives: sizes the run produces (ir/ops/dynamic.py)."""
    given = set().union(set(), *(t.symbols for _, t in gen.inputs))
    return [name for name, _, _ in gen.symbols if name not in given]


def _aligned_empty(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes]
