"""The systems `compare.py` runs side by side, each behind the same small interface.

A runner is built once per model; `prepare(threads)` sets its thread count (ORT and
OpenVINO fix it when a session / compiled model is made, so they make one per count),
`call()` runs one inference on the prepared inputs with the least Python overhead each
system offers (Cuvil: the C API through ctypes with pointer arrays built once; ORT: I/O
binding with pre-bound inputs and outputs; OpenVINO: an infer request with its input
tensors set once; torch: the module under inference mode), `output()` returns the
first output of the last call.

Each system also has `cold_command(...)`: the command of a fresh process that loads the
model's artifact and runs it once, for start-to-first-result time and peak RSS.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent

# (id, label): the order of the rows in every table.
SYSTEMS = [
    ("cuvil", "Cuvil fp32"),
    ("cuvil-bf16", "Cuvil bf16"),
    ("torch", "torch eager"),
    ("ort", "ORT fp32"),
    ("ov-f32", "OpenVINO fp32"),
    ("ov-default", "OpenVINO default"),
]
LABELS = dict(SYSTEMS)
OPSET = 20


class Skip(Exception):
    """A system that cannot run here; the message is the reason shown in its row."""


def short(exc: BaseException, limit: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --- Cuvil -------------------------------------------------------------------------

@contextlib.contextmanager
def keep_shared_library(dest: Path):
    """While active, every shared library that `cuvil.compile` links is also copied to
    `dest` (cuvil.compile links into a temporary directory). Yields a dict that gets
    `path` and `prefix` once a library was linked."""
    import cuvil.native as native
    original = native.link_artifact
    kept: dict = {}

    def link_and_keep(kind, objects, manifest, header_path, out, *args, **kwargs):
        result = original(kind, objects, manifest, header_path, out, *args, **kwargs)
        if kind == "shared":
            tmp = dest.with_name(dest.name + ".tmp")
            shutil.copyfile(result, tmp)
            os.replace(tmp, dest)
            kept.update(path=dest, prefix=manifest.get("prefix"))
        return result

    native.link_artifact = link_and_keep
    try:
        yield kept
    finally:
        native.link_artifact = original


class CuvilRunner:
    """`cuvil.compile` in fp32 (id "cuvil") or with precision bf16 ("cuvil-bf16"); other
    `cuvil.compile` options (`quantization`: a method name or a cuvil.options.Quantization,
    which then carries the precision) with an explicit `system_id`."""

    def __init__(self, module, inputs, lib_path: Path, precision: str = "f32", system_id: str | None = None,
                 **compile_options):
        import ctypes

        import cuvil
        from cuvil.options import Quantization
        self.id = system_id or ("cuvil" if precision == "f32" else f"cuvil-{precision}")
        if precision != "f32":
            compile_options["quantization"] = Quantization(precision=precision)
        with keep_shared_library(lib_path) as kept:
            self.model = cuvil.compile(module, inputs, threads=1, **compile_options)
        self.library = kept.get("path")
        self.prefix = kept.get("prefix")
        self.arrays = [np.ascontiguousarray(t.detach().numpy()) for t in inputs]
        first = self.model(*self.arrays)
        self.outs = [np.empty_like(o) for o in first]
        # The C API directly: CompiledModel.__call__ validates and allocates per call.
        self.fast = hasattr(self.model, "_invoke") and all(
            a.dtype == t.np_dtype for a, (_, t) in zip(self.arrays, self.model.inputs))
        self._in = (ctypes.c_void_p * len(self.arrays))(*[a.ctypes.data for a in self.arrays])
        self._out = (ctypes.c_void_p * len(self.outs))(*[o.ctypes.data for o in self.outs])
        self.call_path = "C API via ctypes (pointer arrays built once)" if self.fast else "CompiledModel.__call__"
        self.info: dict = {"arena_bytes": getattr(self.model, "arena_size", None)}

    def prepare(self, threads: int) -> None:
        self.model.set_threads(threads)

    def call(self) -> None:
        if self.fast:
            self.model._invoke(self._in, self._out)
        else:
            self.outs = list(self.model(*self.arrays))

    def output(self) -> np.ndarray:
        return self.outs[0]

    def release(self) -> None:
        self.model = None


# --- torch eager -------------------------------------------------------------------

class TorchRunner:
    id = "torch"
    call_path = "module(*inputs) under torch.inference_mode()"

    def __init__(self, module, inputs):
        self.module, self.inputs, self.out = module, inputs, None
        self.info: dict = {}

    def prepare(self, threads: int) -> None:
        import torch
        torch.set_num_threads(threads)

    def call(self) -> None:
        self.out = self.module(*self.inputs)  # compare.py times torch inside inference_mode

    def output(self) -> np.ndarray:
        return self.out.detach().numpy()

    def release(self) -> None:
        self.module = None


# --- ONNX export, ONNX Runtime, OpenVINO ---------------------------------------------

def export_onnx(module, inputs, names, path: Path) -> Path:
    """`torch.onnx.export(..., dynamo=True)` at OPSET into `path`, unless already there
    (the name carries a hash of the model source, sizes, torch version and opset)."""
    if path.is_file():
        return path
    import logging

    import torch
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    logging.getLogger("torch._export").setLevel(logging.ERROR)
    tmp = path.with_name(path.stem + ".partial.onnx")
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            torch.onnx.export(module, tuple(inputs), str(tmp), dynamo=True, opset_version=OPSET,
                              input_names=list(names), external_data=False)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise Skip(f"ONNX export failed: {short(exc)}") from exc
    os.replace(tmp, path)
    return path


class OrtRunner:
    id = "ort"
    call_path = "InferenceSession.run_with_iobinding (inputs and outputs bound once)"

    def __init__(self, onnx_path: Path, feeds: dict[str, np.ndarray]):
        try:
            import onnxruntime
        except ImportError as exc:
            raise Skip(f"onnxruntime not installed ({short(exc)})") from exc
        self.ort, self.path, self.feeds = onnxruntime, onnx_path, feeds
        self.sess = None
        self.info = {"version": onnxruntime.__version__}

    @staticmethod
    def options(ort, threads: int):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return so

    def prepare(self, threads: int) -> None:
        ort = self.ort
        self.sess = None
        self.sess = ort.InferenceSession(str(self.path), self.options(ort, threads),
                                         providers=["CPUExecutionProvider"])
        first = self.sess.run(None, self.feeds)
        self.binding = self.sess.io_binding()
        self._keep = []
        for name, arr in self.feeds.items():
            value = ort.OrtValue.ortvalue_from_numpy(arr)
            self._keep.append(value)
            self.binding.bind_ortvalue_input(name, value)
        self.outs = []
        for meta, arr in zip(self.sess.get_outputs(), first):
            value = ort.OrtValue.ortvalue_from_shape_and_type(list(arr.shape), arr.dtype.type)
            self.outs.append(value)
            self.binding.bind_ortvalue_output(meta.name, value)

    def call(self) -> None:
        self.sess.run_with_iobinding(self.binding)

    def output(self) -> np.ndarray:
        return self.outs[0].numpy()

    def release(self) -> None:
        self.sess = self.binding = None


def ov_properties(threads: int, fp32: bool) -> dict:
    props = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    if fp32:
        props["INFERENCE_PRECISION_HINT"] = "f32"
    return props


class OvRunner:
    call_path = "InferRequest.start_async + wait (input tensors set once)"

    def __init__(self, onnx_path: Path, feeds: dict[str, np.ndarray], fp32: bool):
        try:
            import openvino
        except ImportError as exc:
            raise Skip(f"openvino not installed ({short(exc)})") from exc
        self.id = "ov-f32" if fp32 else "ov-default"
        self.ov, self.fp32, self.feeds = openvino, fp32, feeds
        self.core = openvino.Core()
        self.model = self.core.read_model(str(onnx_path))
        self.compiled = self.request = None
        self.info = {"version": openvino.__version__}

    def prepare(self, threads: int) -> None:
        self.compiled = self.request = None
        self.compiled = self.core.compile_model(self.model, "CPU", ov_properties(threads, self.fp32))
        precision = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        self.info["inference_precision"] = getattr(precision, "get_type_name", lambda: str(precision))()
        self.info["inference_num_threads"] = int(self.compiled.get_property("INFERENCE_NUM_THREADS"))
        self.request = self.compiled.create_infer_request()
        self._tensors = {name: self.ov.Tensor(arr, shared_memory=True) for name, arr in self.feeds.items()}
        for name, tensor in self._tensors.items():
            self.request.set_tensor(name, tensor)

    def call(self) -> None:
        self.request.start_async()
        self.request.wait()

    def output(self) -> np.ndarray:
        return np.array(self.request.get_output_tensor(0).data, copy=True)

    def release(self) -> None:
        self.request = self.compiled = self.model = None


# --- cold start: a fresh process loads the artifact and runs once ------------------------

CHILD_TORCH = """
import sys
sys.path[:0] = {paths!r}
import numpy as np, torch
torch.set_num_threads({threads})
from bench_models import build
model = build({key!r}, {quick!r})[0]
model.load_state_dict(torch.load({weights!r}, weights_only=True))
xs = [torch.from_numpy(np.load(p)) for p in {npys!r}]
with torch.inference_mode():
    y = model(*xs)
print(float(y.double().sum()))
"""

CHILD_ORT = """
import numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.intra_op_num_threads = {threads}; so.inter_op_num_threads = 1
s = ort.InferenceSession({onnx!r}, so, providers=["CPUExecutionProvider"])
y = s.run(None, {{n: np.load(p) for n, p in zip({names!r}, {npys!r})}})[0]
print(float(y.astype(np.float64).sum()))
"""

CHILD_OV = """
import numpy as np, openvino as ov
r = ov.Core().compile_model({onnx!r}, "CPU", {props!r}).create_infer_request()
r.infer({{n: np.load(p) for n, p in zip({names!r}, {npys!r})}})
print(float(np.asarray(r.get_output_tensor(0).data, np.float64).sum()))
"""


def cold_command(system: str, *, key: str, quick: bool, threads: int, names, npys, bins,
                 onnx: Path | None, weights: Path | None, library: Path | None, prefix: str | None,
                 cuvil_run: Path | None) -> list[str]:
    npys = [str(p) for p in npys]
    if system in ("cuvil", "cuvil-bf16"):
        if library is None or cuvil_run is None:
            raise Skip("no shared library or driver")
        return [str(cuvil_run), str(library), prefix or "cuvil_model", str(threads), *map(str, bins)]
    if system == "torch":
        code = CHILD_TORCH.format(paths=[str(ROOT), str(BENCH_DIR)], threads=threads, key=key,
                                  quick=quick, weights=str(weights), npys=npys)
    elif system == "ort":
        code = CHILD_ORT.format(threads=threads, onnx=str(onnx), names=list(names), npys=npys)
    else:
        code = CHILD_OV.format(onnx=str(onnx), props=ov_properties(threads, system == "ov-f32"),
                               names=list(names), npys=npys)
    return [sys.executable, "-c", code]


def artifact_files(system: str, *, onnx: Path | None, weights: Path | None, library: Path | None) -> list[Path]:
    """What each system ships: Cuvil the shared library alone; ORT/OpenVINO the .onnx
    (and its external data file, if the exporter wrote one); torch the state dict."""
    if system in ("cuvil", "cuvil-bf16"):
        return [library] if library else []
    if system == "torch":
        return [weights] if weights else []
    if onnx is None:
        return []
    data = onnx.with_name(onnx.name + ".data")
    return [onnx] + ([data] if data.is_file() else [])
