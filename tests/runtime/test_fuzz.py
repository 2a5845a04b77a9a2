"""Fuzzing the executable's input parsers (.npy header and data, JPEG, PNG) with
hypothesis: mutated and truncated files must give exit 0 or a one-line error with exit
1; never a signal, a sanitizer report or a stray output file.

The executable under test is built with AddressSanitizer and UndefinedBehaviorSanitizer
(our C code; the static codecs are not instrumented), so an out-of-bounds access that
would not crash still fails the test.
"""
from __future__ import annotations

import io
import json
import os
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from cuvil.native import link_artifact

SANITIZED_EXIT = 99
ENV = {**os.environ,
       "ASAN_OPTIONS": f"exitcode={SANITIZED_EXIT}:detect_leaks=1",
       "UBSAN_OPTIONS": f"halt_on_error=1:exitcode={SANITIZED_EXIT}:print_stacktrace=1"}


@pytest.fixture(scope="module")
def fuzz_exe(cnn, tmp_path_factory):
    return link_artifact("exe", cnn.objects, cnn.manifest, cnn.header,
                         tmp_path_factory.mktemp("fuzz") / "tiny_cnn",
                         cc="cc -fsanitize=address,undefined -fno-omit-frame-pointer")


def _seeds() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (20, 28, 3), dtype=np.uint8)
    out = {}
    buf = io.BytesIO()
    np.save(buf, rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    out["npy"] = buf.getvalue()
    for fmt, kw in (("PNG", {}), ("JPEG", {"quality": 90}), ("PNG-interlaced", {"interlace": 1})):
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, fmt.split("-")[0], **kw)
        out[fmt] = buf.getvalue()
    return out


SEEDS = _seeds()

mutation = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 1 << 16), st.just(b"")),
    st.tuples(st.just("overwrite"), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("overwrite_head"), st.integers(0, 127), st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=16)),
)


def _mutate(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for kind, pos, payload in mutations:
        pos = pos % (len(buf) + 1)
        if kind == "truncate":
            del buf[pos:]
        elif kind.startswith("overwrite"):
            buf[pos:pos + len(payload)] = payload
        elif kind == "insert":
            buf[pos:pos] = payload
        else:
            del buf[pos:pos + len(payload)]
    return bytes(buf)


def _check_run(exe, src, out_dir):
    out = out_dir / "out.json"
    proc = subprocess.run([str(exe), "--input", str(src), "--output", str(out)], capture_output=True, text=True,
                          env=ENV, timeout=60, errors="replace")
    assert proc.returncode in (0, 1), f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    if proc.returncode == 1:
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tiny_cnn: input 'x' ("), proc.stderr
        assert list(out_dir.iterdir()) == []
    else:
        assert len(json.loads(out.read_text())["top_k"]) == 3
        out.unlink()


FUZZ = settings(max_examples=20, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(mutations=st.lists(mutation, min_size=1, max_size=4))
def test_fuzz_npy(fuzz_exe, tmp_path, mutations):
    _fuzz_one(fuzz_exe, tmp_path, SEEDS["npy"], mutations)


@FUZZ
@given(seed=st.sampled_from(["PNG", "JPEG", "PNG-interlaced"]), mutations=st.lists(mutation, min_size=1, max_size=4))
def test_fuzz_images(fuzz_exe, tmp_path, seed, mutations):
    _fuzz_one(fuzz_exe, tmp_path, SEEDS[seed], mutations)


def _fuzz_one(exe, tmp_path, data, mutations):
    src = tmp_path / "input.bin"
    src.write_bytes(_mutate(data, mutations))
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    _check_run(exe, src, out_dir)


def test_unmutated_seeds_run(fuzz_exe, tmp_path):
    """The fuzz seeds themselves are good inputs (else the fuzzing proves little)."""
    for name, data in SEEDS.items():
        src = tmp_path / name
        src.write_bytes(data)
        proc = subprocess.run([str(fuzz_exe), "--input", str(src), "--output", str(tmp_path / "o.json")],
                              capture_output=True, text=True, env=ENV)
        assert proc.returncode == 0, (name, proc.stderr)
