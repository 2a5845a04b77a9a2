"""The .cvir bundle: write/read round-trips (text equal, weights equal bytewise), bytes
depend only on the module, and a malformed bundle raises ParseError, nothing else."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cuvil.ir as cir
from cuvil.errors import ParseError
from cuvil.frontends.torch import capture_torch
from cuvil.ir import Function, Module, TensorType
from cuvil.ir.builder import Builder
from cuvil.ir.bundle import FORMAT
from tests.ir.models import NAMES, captured




def assert_same_weights(a: Module, b: Module, skip=frozenset()) -> None:
    wa, wb = a.weights(), b.weights()
    assert list(wa) == list(wb)
    for name in wa:
        if name in skip:
            continue
        assert (wa[name].dtype, wa[name].shape) == (wb[name].dtype, wb[name].shape), name
        assert wa[name].tobytes() == wb[name].tobytes(), name


@pytest.mark.parametrize("name", NAMES)
def test_model_bundle_round_trips(name, tmp_path):
    _, _, module = captured(name)
    cir.write_bundle(module, tmp_path / "m.cvir")
    back = cir.read_bundle(tmp_path / "m.cvir")
    want, got = cir.print_module(module).splitlines(), cir.print_module(back).splitlines()
    assert len(got) == len(want)
    zero_d = {n for n, w in module.weights().items() if w.ndim == 0}
    differing = [w for g, w in zip(got, want) if g != w]
    # everything but the 0-d weights' own constant lines must already round-trip
    assert all(any(f"{{name = {json.dumps(n)}}}" in line for n in zero_d) for line in differing), differing[:3]
    assert_same_weights(back, module, skip=zero_d)
    assert not differing, differing[:3]
    assert_same_weights(back, module)
    cir.verify(back)


@pytest.mark.parametrize("name", ["resnet18", "vit"])
def test_bundle_bytes_are_deterministic(name, tmp_path):
    model, inputs, module = captured(name)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cir.write_bundle(module, tmp_path / "a" / "m.cvir")
    cir.write_bundle(module, tmp_path / "b" / "other-name.cvir")
    cir.write_bundle(capture_torch(model, inputs), tmp_path / "b" / "recaptured.cvir")
    data = (tmp_path / "a" / "m.cvir").read_bytes()
    assert data == (tmp_path / "b" / "other-name.cvir").read_bytes()
    assert data == (tmp_path / "b" / "recaptured.cvir").read_bytes()


@pytest.mark.parametrize("name", ["mixer", "resnet18"])
def test_reread_bundle_writes_the_same_bytes(name, tmp_path):
    _, _, module = captured(name)
    cir.write_bundle(module, tmp_path / "a.cvir")
    cir.write_bundle(cir.read_bundle(tmp_path / "a.cvir"), tmp_path / "b.cvir")
    assert (tmp_path / "a.cvir").read_bytes() == (tmp_path / "b.cvir").read_bytes()


def module_with_constants(arrays: dict[str, np.ndarray]) -> Module:
    """main(x) returns x and one cast-to-f32 sum per constant, so every constant is used."""
    fn = Function("main", ["x"], [TensorType((1,))], [])
    b = Builder(fn.body)
    outs = [fn.args[0]]
    for name, arr in arrays.items():
        c = b.constant(arr, name)
        outs.append(b.op("cuvil.reduce_sum", b.op("cuvil.cast", c, dtype="f32"), axes=list(range(c.type.rank)),
                         keepdims=False))
    fn.output_names = [f"out{i}" for i in range(len(outs))]
    b.op_multi("cuvil.return", *outs)
    module = Module()
    module.add(fn)
    cir.verify(module)
    return module


def test_every_dtype_round_trips_bytewise(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f16": rng.standard_normal(5).astype(np.float16),
        "f64": np.array([np.pi, -0.0, np.inf, -np.inf, 5e-324]),
        "nan": np.array([np.nan, -np.nan], np.float32),
        "i64": np.array([-(2 ** 63), 2 ** 63 - 1, 0]),
        "i32": rng.integers(-100, 100, (2, 2), dtype=np.int32),
        "i8": np.array([-128, 127], np.int8),
        "u8": np.array([0, 255], np.uint8),
        "bool": np.array([[True, False], [False, True]]),
        "empty": np.zeros((0, 3), np.float32),
        "a weight with \"quotes\" and ünïcode": np.ones(2, np.float32),
    }
    module = module_with_constants(arrays)
    cir.write_bundle(module, tmp_path / "m.cvir")
    back = cir.read_bundle(tmp_path / "m.cvir")
    assert cir.print_module(back) == cir.print_module(module)
    assert_same_weights(back, module)
    for name, arr in arrays.items():  # little-endian on disk whatever the host
        assert back.weights()[name].tobytes() == arr.astype(arr.dtype.newbyteorder("<")).tobytes()


def test_zero_dim_constant_keeps_its_shape():
    module = module_with_constants({"scalar": np.array(2.5, np.float32)})
    assert module.weights()["scalar"].shape == ()
    assert module.main.body.ops[0].result.type.shape == ()


def test_zero_dim_weight_round_trips(tmp_path):
    module = module_with_constants({"scalar": np.array(2.5, np.float32)})
    cir.write_bundle(module, tmp_path / "m.cvir")
    assert cir.read_bundle(tmp_path / "m.cvir").weights()["scalar"].shape == ()


# -- malformed bundles -------------------------------------------------------------------
def small_bundle(tmp_path) -> bytes:
    module = module_with_constants({"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                                    "b": np.arange(3, dtype=np.int64)})
    cir.write_bundle(module, tmp_path / "good.cvir")
    return (tmp_path / "good.cvir").read_bytes()


def split(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(header: dict, body: bytes) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + body


def read(tmp_path, data: bytes):
    path = tmp_path / "bad.cvir"
    path.write_bytes(data)
    return cir.read_bundle(path)


def test_small_bundle_reads(tmp_path):
    header, body = split(small_bundle(tmp_path))
    module = read(tmp_path, join(header, body))  # re-encoding the header is harmless
    assert module.weights()["w"].tolist() == [[0, 1, 2], [3, 4, 5]]


@given(st.data())
def test_truncated_bundle_raises_parse_error(tmp_path_factory, data):
    tmp_path = tmp_path_factory.mktemp("trunc")
    good = small_bundle(tmp_path)
    cut = data.draw(st.integers(0, len(good) - 1), label="length kept")
    with pytest.raises(ParseError):
        read(tmp_path, good[:cut])


def edit_header(fn):
    def make(tmp_path):
        header, body = split(small_bundle(tmp_path))
        fn(header)
        return join(header, body)
    return make


def entry(name, key, value):
    return edit_header(lambda h: h[name].__setitem__(key, value))


MALFORMED = {
    "empty file": lambda p: b"",
    "header length past the end": lambda p: struct.pack("<Q", 10 ** 6) + small_bundle(p)[8:],
    "header length 2**64-1": lambda p: b"\xff" * 8 + small_bundle(p)[8:],
    "header length cuts the JSON": lambda p: struct.pack("<Q", 20) + small_bundle(p)[8:],
    "header not JSON": lambda p: struct.pack("<Q", 4) + b"\x00\xff{]",
    "header is a list": lambda p: struct.pack("<Q", 2) + b"[]",
    "no metadata": edit_header(lambda h: h.pop("__metadata__")),
    "wrong format tag": edit_header(lambda h: h["__metadata__"].__setitem__("format", FORMAT[:-1] + "0")),
    "no format tag": edit_header(lambda h: h["__metadata__"].pop("format")),
    "ir not a string": edit_header(lambda h: h["__metadata__"].__setitem__("ir", 42)),
    "offset past the end": entry("w", "data_offsets", [0, 10 ** 6]),
    "offsets reversed": entry("w", "data_offsets", [24, 0]),
    "negative offset": entry("w", "data_offsets", [-24, 0]),
    "offsets disagree with shape": entry("w", "data_offsets", [0, 20]),
    "shape disagrees with offsets": entry("w", "shape", [3, 3]),
    "negative dim": entry("w", "shape", [-2, -3]),
    "unknown dtype": entry("w", "dtype", "F8"),
    "offsets not numbers": entry("w", "data_offsets", ["a", "b"]),
    "entry not a dict": edit_header(lambda h: h.__setitem__("w", [1, 2])),
    "missing weight": edit_header(lambda h: h.pop("w")),
    "ir text garbage": edit_header(lambda h: h["__metadata__"].__setitem__("ir", "func main(")),
}


@pytest.mark.parametrize("make", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_bundle_raises_parse_error(tmp_path, make):
    with pytest.raises(ParseError):
        read(tmp_path, make(tmp_path))


def test_huge_dim_raises_parse_error(tmp_path):
    with pytest.raises(ParseError):
        read(tmp_path, entry("w", "shape", [2 ** 70])(tmp_path))
