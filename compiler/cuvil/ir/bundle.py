"""The .cvir bundle: one file in the safetensors layout (an 8-byte header length, a JSON
header of names, dtypes, shapes and offsets, then raw little-endian data). The IR text
rides in the header's `__metadata__`. Nothing is unpickled or evaluated on load."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import ParseError, short
from ..fsutil import atomic_write, read_regular
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


MAX_BUNDLE = 1 << 36  # 64 GiB: a larger .cvir is refused unread


def _int(v) -> int:
    """A JSON integer (not a bool, not 10.5, not "10")."""
    if type(v) is not int:
        raise TypeError(v)
    return v


def read_bundle(path: str | os.PathLike) -> Module:
    """The module of a .cvir file (a regular file of at most MAX_BUNDLE bytes). Refused,
    with one line: a bad header, a shape that is not a list of non-negative integers,
    data offsets that overlap, leave a gap or do not end at the data's end, a size that
    is not shape x dtype, a weight the IR does not use, IR text that does not parse
    (nesting is bounded), no `main` function."""
    data = read_regular(path, MAX_BUNDLE, ".cvir bundle", ParseError)
    where = f"{path}"
    if len(data) < 8:
        raise ParseError(f"{where}: too short to be a .cvir bundle")
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise ParseError(f"{where}: header length {n} is out of range")
    try:
        header = json.loads(data[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ParseError(f"{where}: header is not JSON ({str(e)[:80] or type(e).__name__})") from None
    meta = header.pop("__metadata__", None) if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("ir"), str):
        raise ParseError(f"{where}: not a {FORMAT} bundle")
    body = memoryview(data)[8 + n:]
    spans = []
    for name, info in header.items():
        shown = short(name)
        try:
            np_dtype = np.dtype(_NP[info["dtype"]])
            shape = [_int(d) for d in info["shape"]]
            start, end = (_int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ParseError(f"{where}: bad header entry for {shown} (dtype, shape and data_offsets "
                             "must be a known dtype, a list of integers and two integers)") from None
        count = 1
        for d in shape:  # Python ints: no overflow, and a bound before any allocation
            count *= max(d, 0)
        if min(shape, default=0) < 0 or not 0 <= start <= end <= len(body) or end - start != count * np_dtype.itemsize:
            raise ParseError(f"{where}: tensor {shown} has inconsistent shape/offsets")
        spans.append((start, end, name))
    pos = 0
    for start, end, name in sorted(spans):
        if start != pos:
            what = "overlaps the tensor before it" if start < pos else f"leaves a gap at byte {pos}"
            raise ParseError(f"{where}: tensor {short(name)} {what}")
        pos = end
    if pos != len(body):
        raise ParseError(f"{where}: {len(body) - pos} bytes of data past the last tensor")
    weights = {name: np.frombuffer(body[start:end], dtype=np.dtype(_NP[header[name]["dtype"]]))
               .reshape(header[name]["shape"]).astype(np.dtype(_NP[header[name]["dtype"]]).newbyteorder("="))
               for start, end, name in spans}
    try:
        module = parse_module(meta["ir"], weights)
    except ParseError as e:
        raise ParseError(f"{where}: IR {e}") from None
    if "main" not in module.functions:
        raise ParseError(f"{where}: the IR has no 'main' function")
    unused = sorted(set(weights) - set(module.weights()))
    if unused:
        raise ParseError(f"{where}: tensor {short(unused[0])} is not used by the IR"
                         + (f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""))
    return module
