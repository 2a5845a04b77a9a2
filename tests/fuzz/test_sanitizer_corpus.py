"""At least 1,000 malformed inputs through an executable built with AddressSanitizer and
UndefinedBehaviorSanitizer (our C code; the static codecs are not instrumented): crafted
and mutated .npy headers, mutated PNG and JPEG files, decompression bombs, special files,
bad --threads values and bad flags. Each run must end with exit 0 (a valid output) or
exit 1 / 2 with one line on stderr, and no output or temporary file left; never a
signal, a sanitizer report or a hang. The corpus is generated from a fixed seed, so every
run of CI checks the same inputs; the counts are printed.
"""
from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cuvil.native import link_artifact
from tests.runtime.helpers import CNN_LABELS, TinyCNN, build_model

SANITIZED_EXIT = 99
ENV = {**os.environ,
       "ASAN_OPTIONS": f"exitcode={SANITIZED_EXIT}:detect_leaks=1",
       "UBSAN_OPTIONS": f"halt_on_error=1:exitcode={SANITIZED_EXIT}:print_stacktrace=1"}
MIN_INPUTS = 1000


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    torch.manual_seed(0)
    model = build_model(TinyCNN(), (torch.randn(1, 3, 16, 16),), "tiny_cnn", tmp_path_factory.mktemp("cnn"))
    name_in, name_out = model.manifest["inputs"][0]["name"], model.manifest["outputs"][0]["name"]
    model.manifest["preprocess"] = {name_in: {
        "kind": "image", "resize": 20, "crop": 16, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
        "scale": 1 / 255, "layout": "NCHW", "color": "RGB"}}
    model.manifest["postprocess"] = {name_out: {"kind": "classification", "top_k": 3, "softmax": True,
                                                "labels": CNN_LABELS}}
    return link_artifact("exe", model.objects, model.manifest, model.header,
                         tmp_path_factory.mktemp("asan") / "tiny_cnn",
                         cc="cc -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer")


# -- the corpus --------------------------------------------------------------------------------
def npy_bytes(header: str, data: bytes = b"", version: int = 1) -> bytes:
    text = header.encode("latin-1")
    if version == 1:
        pad = -(10 + len(text) + 1) % 64
        text += b" " * pad + b"\n"
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data
    pad = -(12 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(text)) + text + data


GOOD_DATA = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32).tobytes()


def crafted_npy() -> list[bytes]:
    """Headers a careless or hostile writer makes, each with the right amount of data."""
    shapes = ["(1, 3, 16, 16)", "(1,3,16,16,)", "(3, 16, 16)", "()", "(1, 3, 16, -16)", "(1, 3, 16, 16, 1)",
              "(99999999999999999999, 1)", "(9223372036854775807, 9223372036854775807)", "(1, 3, 16, 0x10)",
              "(1, 3, 16, 1e1)", "((1, 3), 16, 16)", "(1, 3, 16, 16" , "[1, 3, 16, 16]", "(" + "1, " * 40 + ")",
              "(1, 3, 16, 16)) ", "(1 3 16 16)", "(-0, 3, 16, 16)", "(+1, 3, 16, 16)", "(01, 3, 16, 16)", "None"]
    descrs = ["'<f4'", "'>f4'", "'|f4'", "'<f8'", "'<i4'", "'f4'", "'<f4 '", "\"<f4\"", "'<f4", "'<f\\x34'",
              "'" + "f" * 200 + "'", "''", "4", "'<c8'", "'<U4'", "'|O'"]
    fortrans = ["False", "True", "false", "0", "None", "'False'"]
    out = []
    for s in shapes:
        out.append(npy_bytes(f"{{'descr': '<f4', 'fortran_order': False, 'shape': {s}, }}", GOOD_DATA))
    for d in descrs:
        out.append(npy_bytes(f"{{'descr': {d}, 'fortran_order': False, 'shape': (1, 3, 16, 16), }}", GOOD_DATA))
    for f in fortrans:
        out.append(npy_bytes(f"{{'descr': '<f4', 'fortran_order': {f}, 'shape': (1, 3, 16, 16), }}", GOOD_DATA))
    dicts = ["{}", "{'descr': '<f4'}", "{'descr': '<f4', 'shape': (1, 3, 16, 16)}", "[]", "",
             "{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (1, 3, 16, 16)}",
             "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 16, 16), 'extra': 1}",
             "{'descr': '<f4' 'fortran_order': False 'shape': (1, 3, 16, 16)}",
             "{descr: '<f4', fortran_order: False, shape: (1, 3, 16, 16)}",
             "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 16, 16), }" + "\0" * 10,
             "\xff\xfe{'descr': '<f4'}", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 16, 16)}}",
             "{" * 1000, "{'descr': '<f4', 'fortran_order': False, 'shape': (" + "(" * 500 + ")" * 500 + ")}"]
    for d in dicts:
        out.append(npy_bytes(d, GOOD_DATA))
    good = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 16, 16), }"
    for version in (2, 3):
        out.append(npy_bytes(good, GOOD_DATA, version))
    for cut in (0, 1, 5, 6, 8, 9, 10, 11, 50, 127, 128, 129, len(GOOD_DATA) // 2, len(GOOD_DATA) + 127):
        out.append(npy_bytes(good, GOOD_DATA)[:cut])
    base = npy_bytes(good, GOOD_DATA)
    out.append(base + b"\0")                                      # one byte too many
    out.append(base[:8] + b"\xff\xff" + base[10:])                # header length past the end
    out.append(base[:8] + b"\x00\x00" + base[10:])                # header length 0
    out.append(b"\x93NUMPY\x04\x00" + base[8:])                   # unknown version
    out.append(b"\x93NUMPY\x02\x00\xff\xff\xff\xff" + base[10:])  # 4 GiB header
    out.append(b"\x93NUMPX" + base[6:])                           # bad magic
    return out


def png(width: int, height: int, idat: bytes | None = None, color_type: int = 2, depth: int = 8) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    if idat is None:
        idat = zlib.compress(b"\0" * 64)
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def bombs() -> list[bytes]:
    """Images that claim huge sizes (decompression bombs), with valid checksums."""
    zeros = zlib.compress(b"\0" * (1 << 22), 9)  # 4 MiB of zeros in a few KiB
    out = [png(100_000, 100_000, zeros), png(16_384, 16_384, zeros), png(1 << 31, 1, zeros),
           png(0, 10), png(10, 0), png(1, 1 << 24, zeros), png(8192, 8193, zeros), png(20, 20, zeros, 6, 16),
           png(20, 20, zeros, 3), png(20, 20, zeros, 7), png(20, 20, zeros, 2, 3)]
    jpeg = jpeg_seed()
    sof = jpeg.index(b"\xff\xc0")
    for h, w in ((65535, 65535), (0, 20), (20, 0), (16385, 1), (1, 16385)):
        out.append(jpeg[:sof + 5] + struct.pack(">HH", h, w) + jpeg[sof + 9:])
    return out


def jpeg_seed() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (24, 28, 3), dtype=np.uint8)).save(buf, "JPEG",
                                                                                               quality=90)
    return buf.getvalue()


def image_seeds() -> list[bytes]:
    pixels = np.random.default_rng(2).integers(0, 256, (20, 28, 3), dtype=np.uint8)
    out = [jpeg_seed()]
    for kw in ({}, {"interlace": 1}):
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "PNG", **kw)
        out.append(buf.getvalue())
    buf = io.BytesIO()
    Image.fromarray(pixels).convert("P").save(buf, "PNG")
    out.append(buf.getvalue())
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=70, progressive=True)
    out.append(buf.getvalue())
    return out


def mutate(rng: np.random.Generator, data: bytes, head: int | None = None) -> bytes:
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        kind = int(rng.integers(0, 5))
        span = len(buf) if head is None else min(head, len(buf))
        pos = int(rng.integers(0, span + 1))
        if kind == 0:
            del buf[pos:]
        elif kind == 1:
            buf[pos:pos + 1] = bytes([int(rng.integers(0, 256))])
        elif kind == 2:
            buf[pos:pos] = rng.bytes(int(rng.integers(1, 17)))
        elif kind == 3:
            del buf[pos:pos + int(rng.integers(1, 17))]
        else:  # a "interesting" value over 1, 2 or 4 bytes
            value = [0, 0xFF, 0x7F, 0x80, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF][int(rng.integers(0, 7))]
            size = int(rng.choice([1, 2, 4]))
            buf[pos:pos + size] = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "big")
    return bytes(buf)


def corpus() -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(33)
    good_npy = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 16, 16), }", GOOD_DATA)
    items = [(f"crafted-{i}.npy", d) for i, d in enumerate(crafted_npy())]
    items += [(f"mutant-{i}.npy", mutate(rng, good_npy, head=128)) for i in range(350)]
    items += [(f"bomb-{i}.img", d) for i, d in enumerate(bombs())]
    seeds = image_seeds()
    items += [(f"mutant-{i}.img", mutate(rng, seeds[i % len(seeds)])) for i in range(550)]
    items += [("empty", b""), ("one-byte", b"\x93"), ("text", b"hello\n")]
    return items


BAD_FLAGS = [
    ["--threads", "0"], ["--threads", "-1"], ["--threads", "99999999999999999999"], ["--threads", "abc"],
    ["--threads", ""], ["--threads", "1.5"], ["--threads", " 2"], ["--threads", "0x2"], ["--threads=100000"],
    ["--threads"], ["--bogus"], ["-x"], ["--input"], ["--output"], ["--output", "{out}", "--output", "{out}"],
    ["--input", "{good}", "--input", "{good}"], ["--input", "nosuch=={good}"], ["--input", "x="],
    ["--output", "{tmp}/no/such/dir/o.json"], ["--output", "{tmp}"], ["--output", ""], [""], ["--logits=1"],
    ["--input", "/dev/zero"], ["--input", "/dev/null"], ["--input", "{tmp}"], ["--input", "{tmp}/nope.npy"],
    ["--input", "{fifo}"], ["--input", "\x1b[31m\xff"], ["--output", "{tmp}/o.txt"],
]


def run(exe, args: list[str], out_dir: Path) -> tuple[int, str]:
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, errors="replace", env=ENV,
                          timeout=60)
    return proc.returncode, proc.stderr


def check(rc: int, err: str, what: str, out: Path) -> str:
    """'ok' or 'refused' if the run behaved; else an assertion error naming `what`."""
    assert "Sanitizer" not in err and "runtime error" not in err and rc != SANITIZED_EXIT, f"{what}\n{err[-3000:]}"
    assert rc in (0, 1, 2), f"{what}: exit {rc}\n{err[-3000:]}"
    if rc == 0:
        assert len(json.loads(out.read_text())["top_k"]) == 3, what
        out.unlink()
        return "ok"
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tiny_cnn: "), f"{what}: {err[-3000:]!r}"
    assert not out.exists(), what
    return "refused"


def test_sanitizer_corpus(exe, tmp_path):
    inputs = tmp_path / "inputs"
    outs = tmp_path / "outs"
    inputs.mkdir()
    outs.mkdir()
    items = corpus()
    for name, data in items:
        (inputs / name).write_bytes(data)
    good = inputs / "good.npy"
    good.write_bytes(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 16, 16), }", GOOD_DATA))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    jobs = [(f"input {name}", ["--input", str(inputs / name), "--output", str(outs / f"{name}.json")],
             outs / f"{name}.json") for name, _ in items]
    jobs += [("a directory as input", ["--input", str(inputs), "--output", str(outs / "dir.json")],
              outs / "dir.json")]
    for i, flags in enumerate(BAD_FLAGS):
        out = outs / f"flags-{i}.json"
        args = [a.format(out=out, good=good, tmp=tmp_path, fifo=fifo) for a in flags]
        if "--input" not in args or args[-1] == "--input":
            args += ["--input", str(good)] if "--input" not in args else []
        if "--output" not in " ".join(args):
            args += ["--output", str(out)]
        jobs.append((f"flags {flags}", args, out))
    assert len(jobs) >= MIN_INPUTS
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: check(*run(exe, job[1], outs), job[0], job[2]), jobs))
    assert list(outs.iterdir()) == [], "output or temporary files left behind"
    counts = {k: results.count(k) for k in ("ok", "refused")}
    assert counts["refused"] > len(jobs) // 2 and counts["ok"] > 0  # the corpus is mostly bad, not all
    print(f"\nsanitizer corpus: {len(jobs)} inputs through an ASan+UBSan executable: {counts['ok']} ran, "
          f"{counts['refused']} refused with one line, 0 sanitizer reports, 0 leftovers")
