"""The .cvir bundle: one file in the safetensors layout (an 8-byte header length, a JSON
header of names, dtypes, shapes and offsets, then raw little-endian data). The IR text
rides in the header's `__metadata__`. Nothing is unpickled or evaluated on load."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import ParseError
from ..fsutil import atomic_write
from .core import Module
from .parser import parse_module
from .printer import print_module

FORMAT = "cuvil-ir-1"
_ST_DTYPES = {"f32": "F32", "f16": "F16", "f64": "F64", "i64": "I64", "i32": "I32",
              "i8": "I8", "u8": "U8", "bool": "BOOL"}
_NP = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4", "I8": "i1",
       "U8": "u1", "BOOL": "?"}
_MAX_HEADER = 100 << 20


def _st_dtype(arr: np.ndarray) -> str:
    from .types import dtype_of
    return _ST_DTYPES[dtype_of(arr)]


def write_bundle(module: Module, path: str | os.PathLike) -> None:
    """Write atomically (temp file + rename); bytes depend only on the module."""
    weights = module.weights()
    header: dict = {"__metadata__": {"format": FORMAT, "ir": print_module(module)}}
    offset = 0
    blobs = []
    for name in sorted(weights):
        arr = np.ascontiguousarray(weights[name]).reshape(np.shape(weights[name]))  # 0-d stays 0-d
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _st_dtype(arr), "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    atomic_write(path, [struct.pack("<Q", len(head)), head, *blobs])


def read_bundle(path: str | os.PathLike) -> Module:
    data = Path(path).read_bytes()
    where = f"{path}"
    if len(data) < 8:
        raise ParseError(f"{where}: too short to be a .cvir bundle")
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise ParseError(f"{where}: header length {n} is out of range")
    try:
        header = json.loads(data[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ParseError(f"{where}: header is not JSON ({e})") from None
    meta = header.pop("__metadata__", None) if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("ir"), str):
        raise ParseError(f"{where}: not a {FORMAT} bundle")
    body = memoryview(data)[8 + n:]
    weights = {}
    for name, info in header.items():
        try:
            np_dtype = np.dtype(_NP[info["dtype"]])
            shape = [int(d) for d in info["shape"]]
            start, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ParseError(f"{where}: bad header entry for {name!r}") from None
        count = 1
        for d in shape:  # Python ints: no overflow, and a bound before any allocation
            count *= max(d, 0)
        if min(shape, default=0) < 0 or not 0 <= start <= end <= len(body) or end - start != count * np_dtype.itemsize:
            raise ParseError(f"{where}: tensor {name!r} has inconsistent shape/offsets")
        weights[name] = np.frombuffer(body[start:end], dtype=np_dtype).reshape(shape).astype(np_dtype.newbyteorder("="))
    return parse_module(meta["ir"], weights)
