"""Embed a model's weights as read-only data in an object file of their own.

How (see the module tests):

* LLVM emits a one-global module, `@sym = hidden constant [N x i8]
  zeroinitializer, align 64`, which costs no IR text and fills the section
  with N zeros quickly (in memory); we then overwrite those zeros in the object
  with the weights, at the offset the object's own symbol table gives (ELF) or
  in its only data segment (wasm). Works for every ELF target and for wasm32.
* An `ir.Constant` byte array in the IR (llvmlite escapes every byte in
  Python) is an order of magnitude slower and needs many times the weights'
  bytes in memory, so it is not used.
* Module-level inline asm with `.incbin` is as fast, but llvmlite 0.50 only
  links the *host* asm parser: for aarch64 or wasm32 LLVM aborts the process
  ("Inline asm not supported by this streamer ...").

The weights live in their own object (not in the kernels' module) because LLVM
would fold loads from a constant it could see; kernels only declare the symbol
(`declare_weights`), and the linker joins the two objects. A separate object
also lets a build re-emit kernels without rewriting hundreds of MB.

No path reaches the object: the bytes depend only on (symbol, data, target).
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

from llvmlite import ir

from cuvil.backend.llvm.target import Target, compile_to_object
from cuvil.errors import BackendError
from cuvil.fsutil import make_temp

WEIGHTS_ALIGN = 64
I8 = ir.IntType(8)
_SYMBOL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_VISIBILITIES = ("hidden", "protected", "default")

Data = bytes | bytearray | memoryview | str | os.PathLike


def _check(symbol: str, visibility: str) -> None:
    if not _SYMBOL_RE.match(symbol):
        raise BackendError(f"weights symbol {symbol!r} is not a C identifier")
    if visibility not in _VISIBILITIES:
        raise BackendError(f"weights visibility {visibility!r} is not one of {_VISIBILITIES}")


def _size_of(data: Data) -> int:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return memoryview(data).nbytes
    return os.path.getsize(data)


def declare_weights(
    module: ir.Module, symbol: str, nbytes: int, visibility: str = "hidden"
) -> ir.GlobalVariable:
    """Declare the blob in a kernel module: `external <vis> constant [nbytes x i8], align 64`.

    Kernels GEP into it as `i8*`/`ptr`. Returns the existing declaration if
    `symbol` is already declared with the same size.
    """
    _check(symbol, visibility)
    existing = module.globals.get(symbol)
    if existing is not None:
        if existing.value_type != ir.ArrayType(I8, nbytes):
            raise BackendError(f"weights symbol {symbol} already declared as {existing.value_type}")
        return existing
    gv = ir.GlobalVariable(module, ir.ArrayType(I8, nbytes), symbol)
    gv.global_constant = True
    gv.align = WEIGHTS_ALIGN
    # llvmlite has no visibility field; this slot is printed right after the
    # linkage, which is where LLVM's grammar puts the visibility.
    gv.storage_class = visibility
    return gv


def _placeholder_object(symbol: str, nbytes: int, target: Target, visibility: str) -> tuple[bytes, int]:
    """An object defining `symbol` as nbytes zeros, and the file offset of those bytes.

    An empty blob is allowed (a model without weights): nothing to patch then.
    """
    text = (
        f'@{symbol} = {visibility} constant [{nbytes} x i8] zeroinitializer, '
        f"align {WEIGHTS_ALIGN}\n"
    )
    obj = compile_to_object(text, target, opt=0)
    if nbytes == 0:
        return obj, 0
    if obj[:4] == b"\x7fELF":
        offset = _elf_symbol_offset(obj, symbol, nbytes)
    elif obj[:4] == b"\0asm":
        offset = _wasm_data_offset(obj, nbytes)
    else:
        raise BackendError(f"cannot place weights in a {target.triple} object: not ELF or wasm")
    if obj[offset : offset + min(nbytes, 64)].strip(b"\0"):
        raise BackendError(f"weights placeholder for {symbol} not found in the {target.triple} object")
    return obj, offset


def weights_object(symbol: str, data: Data, target: Target, visibility: str = "hidden") -> bytes:
    """Object file bytes defining `symbol` as the 64-byte aligned read-only `data`.

    `data` is the bytes themselves or the path of a file holding them.
    """
    _check(symbol, visibility)
    nbytes = _size_of(data)
    obj, offset = _placeholder_object(symbol, nbytes, target, visibility)
    payload = data if isinstance(data, (bytes, bytearray, memoryview)) else Path(data).read_bytes()
    return b"".join((obj[:offset], payload, obj[offset + nbytes :]))


def write_weights_object(
    out: str | os.PathLike, symbol: str, data: Data, target: Target, visibility: str = "hidden"
) -> Path:
    """Like `weights_object`, written to `out` (atomically), streaming a file `data`."""
    _check(symbol, visibility)
    out = Path(out)
    nbytes = _size_of(data)
    obj, offset = _placeholder_object(symbol, nbytes, target, visibility)
    tmp_name = make_temp(out.parent)
    try:
        with open(tmp_name, "wb") as dst:
            dst.write(obj[:offset])
            if isinstance(data, (bytes, bytearray, memoryview)):
                dst.write(data)
            else:
                with open(data, "rb") as src:
                    copied = 0
                    while chunk := src.read(1 << 24):
                        dst.write(chunk)
                        copied += len(chunk)
                if copied != nbytes:
                    raise BackendError(f"weights file {data} changed size while being read")
            dst.write(obj[offset + nbytes :])
        os.replace(tmp_name, out)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return out


def add_weights_blob(
    module: ir.Module, symbol: str, data: Data, target: Target, visibility: str = "hidden"
) -> tuple[ir.GlobalVariable, bytes]:
    """Declare `symbol` in `module` and return (declaration, object bytes defining it).

    Link the returned object with the kernels' object.
    """
    gv = declare_weights(module, symbol, _size_of(data), visibility)
    return gv, weights_object(symbol, data, target, visibility)


def _elf_symbol_offset(obj: bytes, symbol: str, nbytes: int) -> int:
    """File offset of `symbol`'s bytes in a relocatable ELF (32/64-bit, either endian)."""
    is64 = obj[4] == 2
    end = "<" if obj[5] == 1 else ">"
    if is64:
        shoff = struct.unpack_from(end + "Q", obj, 0x28)[0]
        shentsize, shnum = struct.unpack_from(end + "HH", obj, 0x3A)
        sec_fmt, sym_fmt = "IIQQQQIIQQ", "IBBHQQ"
    else:
        shoff = struct.unpack_from(end + "I", obj, 0x20)[0]
        shentsize, shnum = struct.unpack_from(end + "HH", obj, 0x2E)
        sec_fmt, sym_fmt = "IIIIIIIIII", "IIIBBH"
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    sections = [struct.unpack_from(end + sec_fmt, obj, shoff + i * shentsize) for i in range(shnum)]
    sym_size = struct.calcsize(end + sym_fmt)
    want = symbol.encode()
    for symtab in (s for s in sections if s[1] == 2):  # SHT_SYMTAB
        strtab_offset = sections[symtab[6]][4]
        for k in range(symtab[5] // sym_size):
            fields = struct.unpack_from(end + sym_fmt, obj, symtab[4] + k * sym_size)
            if is64:
                name, _, _, shndx, value, size = fields
            else:
                name, value, size, _, _, shndx = fields
            start = strtab_offset + name
            if obj[start : obj.index(b"\0", start)] != want:
                continue
            section = sections[shndx]
            if section[1] != 1 or size != nbytes:  # SHT_PROGBITS
                raise BackendError(f"weights symbol {symbol} is not {nbytes} bytes of file data")
            if section[8] < WEIGHTS_ALIGN:
                raise BackendError(f"weights section aligned to {section[8]}, not {WEIGHTS_ALIGN}")
            return section[4] + value
    raise BackendError(f"weights symbol {symbol} missing from the ELF symbol table")


def _uleb(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, pos


def _wasm_data_offset(obj: bytes, nbytes: int) -> int:
    """File offset of the payload of the single data segment of a wasm object."""
    pos = 8  # magic + version
    while pos < len(obj):
        section_id = obj[pos]
        size, pos = _uleb(obj, pos + 1)
        if section_id == 11:  # data
            count, p = _uleb(obj, pos)
            if count != 1:
                break
            flags, p = _uleb(obj, p)
            if flags == 2:
                _, p = _uleb(obj, p)  # memory index
            if flags in (0, 2):  # active: skip `i32.const <leb> end`
                _, p = _uleb(obj, p + 1)
                p += 1
            seg_size, p = _uleb(obj, p)
            if seg_size == nbytes:
                return p
            break
        pos += size
    raise BackendError(f"no single {nbytes}-byte data segment in the wasm weights object")
