"""ABI signatures: which target, Cuvil ABI and runtime version an object was built for.

Every model object (the compile stage adds `<prefix>_signature`), runtime object
(`cuvil_runtime_signature` in cuvil_runtime.c) and plugin module (CUVIL_PLUGIN in
cuvil_plugin.h) holds a NUL-terminated string in its read-only data:

    CUVIL-SIGNATURE:kind=model;name=mobilenet_v2;abi=2;runtime=0.2.0;triple=aarch64-unknown-linux-gnu

The link stage reads them from the bytes of each input (object, archive, ELF or
wasm) and refuses a combination whose triple or ABI versions differ; the runtime
compares the model's and each plugin's against its own when it starts. The
versions are defined once, in the C headers, and read from there.
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

_DIR = Path(__file__).resolve().parent
MAGIC = b"CUVIL-SIGNATURE:"


def _define(header: str, name: str) -> str:
    m = re.search(rf"^#define {name} (\S+)", (_DIR / header).read_text(), re.M)
    if m is None:
        raise RuntimeError(f"{header} does not define {name}")
    return m.group(1).strip('"')


ABI_VERSION = int(_define("cuvil_runtime.h", "CUVIL_ABI_VERSION"))
RUNTIME_VERSION = _define("cuvil_runtime.h", "CUVIL_RUNTIME_VERSION")
PLUGIN_ABI_VERSION = int(_define("cuvil_plugin.h", "CUVIL_PLUGIN_ABI_VERSION"))

# ELF e_machine -> the arch part of a triple.
_ELF_MACHINES = {62: "x86_64", 183: "aarch64", 3: "i386", 40: "arm", 243: "riscv"}


def model_signature(prefix: str, triple: str) -> str:
    """The signature string the compile stage puts into a model object."""
    return (f"{MAGIC.decode()}kind=model;name={prefix};abi={ABI_VERSION};runtime={RUNTIME_VERSION};"
            f"triple={triple}")


def signature_fields(text: str) -> dict[str, str]:
    body = text[len(MAGIC):] if text.startswith(MAGIC.decode()) else text
    out = {}
    for item in body.split(";"):
        key, sep, value = item.partition("=")
        if sep:
            out[key] = value
    return out


def find_signatures(data: bytes) -> list[dict[str, str]]:
    """Every signature in `data` (an object, archive or linked binary), in order, without duplicates."""
    found, seen = [], set()
    start = 0
    while (i := data.find(MAGIC, start)) >= 0:
        end = data.find(b"\0", i)
        end = len(data) if end < 0 else end
        raw = data[i:end]
        start = end
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            continue
        if text in seen:
            continue
        seen.add(text)
        fields = signature_fields(text)
        if "kind" in fields and "triple" in fields:
            found.append(fields)
    return found


def object_arch(data: bytes) -> str | None:
    """The architecture of an ELF or wasm file ('x86_64', 'aarch64', 'wasm32'), else None."""
    if data[:4] == b"\0asm":
        return "wasm32"
    if data[:4] == b"\x7fELF" and len(data) >= 20:
        endian = "<" if data[5] == 1 else ">"
        (machine,) = struct.unpack_from(endian + "H", data, 18)
        return _ELF_MACHINES.get(machine, f"ELF machine {machine}")
    return None


def describe(sig: dict[str, str]) -> str:
    """`model mobilenet_v2 for aarch64-unknown-linux-gnu (Cuvil ABI 2, runtime 0.2.0)`."""
    extra = f", plugin ABI {sig['plugin_abi']}" if "plugin_abi" in sig else ""
    return (f"{sig.get('kind', '?')} {sig.get('name', '?')} for {sig.get('triple', '?')} "
            f"(Cuvil ABI {sig.get('abi', '?')}{extra}, runtime {sig.get('runtime', '?')})")
