"""Hypothesis fuzzing of the compiler's two file loaders (issue 33): the config loader
(`load_config`: YAML, schema, files) and the .cvir loader (`read_bundle`). Whatever the
bytes, each returns a result or raises its own error (ConfigError / ParseError) with one
line of bounded length; never another exception, never a traceback."""
from __future__ import annotations

import json
import struct
import textwrap

import numpy as np
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuvil.ir as cir
from cuvil.config import load_config
from cuvil.errors import ParseError
from cuvil.ir import Function, Module, TensorType
from cuvil.ir.builder import Builder
from cuvil.yaml_load import ConfigError

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

CONFIG = textwrap.dedent("""\
    model:
      framework: pytorch
      source: net.py
      entry: make
    inputs:
      - name: x
        shape: [1, 4]
        dtype: f32
    optimize:
      threads: 2
    build:
      artifact: executable
    """).encode()


def one_line(e: Exception) -> None:
    text = str(e)
    assert "\n" not in text and 0 < len(text) < 1000, repr(text[:2000])


def mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for kind, pos, payload in edits:
        pos = pos % (len(buf) + 1)
        if kind == 0:
            del buf[pos:]
        elif kind == 1:
            buf[pos:pos + len(payload)] = payload
        elif kind == 2:
            buf[pos:pos] = payload
        else:
            del buf[pos:pos + len(payload)]
    return bytes(buf)


edits = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=12)),
                 min_size=1, max_size=5)
yaml_tokens = st.sampled_from([b"&a ", b"*a", b"!!python/object:os.system ", b"!!binary ", b"<<: ", b"[", b"]",
                               b"{", b"}", b"- ", b": ", b"\n  ", b"\t", b"'", b'"', b"---\n", b"...\n",
                               b"? ", b"%YAML 1.1\n", b"!x ", b"\xff", b"null", b"1e400", b"0x10"])
token_edits = st.lists(st.tuples(st.just(2), st.integers(0, 1 << 16), yaml_tokens), min_size=1, max_size=6)

values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                      lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                                         children, max_size=4),
                      max_leaves=20)


def _load(path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError as e:
        one_line(e)


@FUZZ
@given(edits=st.one_of(edits, token_edits))
def test_config_loader_mutated_bytes(tmp_path, edits):
    (tmp_path / "net.py").write_text("def make():\n    pass\n")
    _load(tmp_path / "config.yaml", mutate(CONFIG, edits))


@FUZZ
@given(section=st.sampled_from(["model", "inputs", "optimize", "build", "dims", "overrides", "target", "plugin",
                                "quantization", "outputs", "other"]), value=values)
def test_config_loader_random_values(tmp_path, section, value):
    """Any YAML value in any section: a schema error of one line, never a traceback."""
    (tmp_path / "net.py").write_text("def make():\n    pass\n")
    data = yaml.safe_load(CONFIG)
    data[section] = value
    _load(tmp_path / "config.yaml", yaml.safe_dump(data).encode())


def _bundle(tmp_path) -> bytes:
    fn = Function("main", ["x"], [TensorType((2, 3))], ["y"])
    b = Builder(fn.body)
    w = b.constant(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    c = b.constant(np.arange(3, dtype=np.int64), "c")
    b.op_multi("cuvil.return", b.op("cuvil.add", b.op("cuvil.add", fn.args[0], w), b.op("cuvil.cast", c, dtype="f32")))
    module = Module()
    module.add(fn)
    cir.write_bundle(module, tmp_path / "good.cvir")
    return (tmp_path / "good.cvir").read_bytes()


def _read(path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        cir.read_bundle(path)
    except ParseError as e:
        one_line(e)


@FUZZ
@given(edits=edits)
def test_bundle_loader_mutated_bytes(tmp_path, edits):
    _read(tmp_path / "m.cvir", mutate(_bundle(tmp_path), edits))


@FUZZ
@given(key=st.sampled_from(["dtype", "shape", "data_offsets"]), name=st.sampled_from(["w", "c"]), value=values)
def test_bundle_loader_random_header_values(tmp_path, key, name, value):
    data = _bundle(tmp_path)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header[name][key] = value
    head = json.dumps(header).encode()
    _read(tmp_path / "m.cvir", struct.pack("<Q", len(head)) + head + data[8 + n:])


@FUZZ
@given(edits=st.one_of(edits, st.lists(st.tuples(st.just(2), st.integers(0, 1 << 12), st.sampled_from(
    [b"{", b"}", b"[", b"]", b" regions {", b"\n}\n", b"func @main() -> () {\n", b"%0", b"\n", b"=", b","])),
    min_size=1, max_size=8)))
def test_bundle_loader_mutated_ir_text(tmp_path, edits):
    data = _bundle(tmp_path)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    ir = header["__metadata__"]["ir"].encode()
    header["__metadata__"]["ir"] = mutate(ir, edits).decode("utf-8", "replace")
    head = json.dumps(header).encode()
    _read(tmp_path / "m.cvir", struct.pack("<Q", len(head)) + head + data[8 + n:])
