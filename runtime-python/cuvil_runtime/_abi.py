"""The C structures of cuvil_runtime.h (ABI 3) as ctypes, and how a library names its model.

A shared library built by Cuvil exports `<prefix>_model_desc()`, which returns the
model's `cuvil_model_desc`, and holds the model object's ABI signature in its
read-only data ("CUVIL-SIGNATURE:kind=model;name=<prefix>;abi=3;..."): the signature
gives the prefix, the prefix the descriptor.
"""
from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

ABI_VERSION = 3  # CUVIL_ABI_VERSION this package reads
MAX_RANK = 8  # CUVIL_MAX_RANK
SIGNATURE_MAGIC = b"CUVIL-SIGNATURE:"

# cuvil_dtype -> NumPy dtype
DTYPES = {1: np.dtype(np.float32), 2: np.dtype(np.float16), 3: np.dtype(np.float64), 4: np.dtype(np.int64),
          5: np.dtype(np.int32), 6: np.dtype(np.int8), 7: np.dtype(np.uint8), 8: np.dtype(np.bool_)}


class TensorDesc(ctypes.Structure):
    """cuvil_tensor_desc."""
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("count", ctypes.c_int64), ("nbytes", ctypes.c_uint64)]


class DimDesc(ctypes.Structure):
    """cuvil_dim_desc."""
    _fields_ = [("name", ctypes.c_char_p), ("min", ctypes.c_int64), ("max", ctypes.c_int64)]


class ModelDesc(ctypes.Structure):
    """cuvil_model_desc (ABI 3). Only `abi_version` may be read before it is checked."""
    _fields_ = [("abi_version", ctypes.c_int), ("prefix", ctypes.c_char_p), ("arena_size", ctypes.c_uint64),
                ("n_inputs", ctypes.c_int), ("inputs", ctypes.POINTER(TensorDesc)),
                ("n_outputs", ctypes.c_int), ("outputs", ctypes.POINTER(TensorDesc)),
                ("forward", ctypes.c_void_p), ("signature", ctypes.c_char_p),
                ("n_dims", ctypes.c_int), ("dims", ctypes.POINTER(DimDesc)),
                ("input_dim_symbols", ctypes.POINTER(ctypes.c_int32)),
                ("forward_dims", ctypes.c_void_p), ("shapes", ctypes.c_void_p)]


def signature_fields(text: str) -> dict[str, str]:
    """`kind=model;name=mlp;...` -> {"kind": "model", "name": "mlp", ...}."""
    fields = {}
    for item in text[len(SIGNATURE_MAGIC):].split(";"):
        key, sep, value = item.partition("=")
        if sep:
            fields[key] = value
    return fields


def model_signatures(path: str | os.PathLike) -> list[dict[str, str]]:
    """The distinct model signatures in the file's bytes (mapped, not read into memory)."""
    found: dict[str, dict[str, str]] = {}
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return []
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            at = data.find(SIGNATURE_MAGIC)
            while at >= 0:
                end = data.find(b"\0", at, at + 4096)
                raw = data[at:end if end >= 0 else at + 4096]
                at = data.find(SIGNATURE_MAGIC, at + len(SIGNATURE_MAGIC))
                try:
                    text = raw.decode("ascii")
                except UnicodeDecodeError:
                    continue
                fields = signature_fields(text)
                if fields.get("kind") == "model" and fields.get("name"):
                    found.setdefault(text, fields)
    return list(found.values())


def bind(lib: ctypes.CDLL, prefix: str) -> None:
    """Declare the C functions the package calls (generic runtime and prefixed API)."""
    lib.cuvil_last_error.restype = ctypes.c_char_p
    lib.cuvil_last_error.argtypes = []
    lib.cuvil_status_message.restype = ctypes.c_char_p
    lib.cuvil_status_message.argtypes = [ctypes.c_int]
    lib.cuvil_ctx_tensor.restype = ctypes.POINTER(TensorDesc)
    lib.cuvil_ctx_tensor.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    signatures = {
        "model_desc": (ctypes.POINTER(ModelDesc), []),
        "create": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p)]),
        "destroy": (ctypes.c_int, [ctypes.c_void_p]),
        "set_threads": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
        "set_input_shape": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                           ctypes.c_int]),
        "run": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, f"{prefix}_{name}")
        fn.restype, fn.argtypes = restype, argtypes
