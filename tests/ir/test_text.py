"""IR text: print -> parse -> print is the identity for captured models and for any
attribute values; malformed text raises ParseError and nothing else."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cuvil.ir as cir
from cuvil.errors import ParseError
from cuvil.ir import Function, Module, TensorType
from cuvil.ir.builder import Builder
from cuvil.ir.parser import parse_attrs
from cuvil.ir.printer import format_attrs
from tests.ir.models import NAMES, captured


@pytest.mark.parametrize("name", NAMES)
def test_captured_model_round_trips(name):
    _, _, module = captured(name)
    text = cir.print_module(module)
    again = cir.parse_module(text, module.weights())
    assert cir.print_module(again) == text
    cir.verify(again)
    assert len(text.splitlines()) > 20  # a real model, not an empty function


# -- attribute values ---------------------------------------------------------------------
KEYS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,8}", fullmatch=True)
SCALARS = (st.none() | st.booleans() | st.integers() | st.text(max_size=12)
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([-0.0, 0.0, 1e-300, -1e-300, 5e-324, 1e300, 1e16, 0.1, 1 / 3]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
                      max_leaves=12)


def same(a, b) -> bool:
    """Equal in type and value; NaN equals NaN and -0.0 differs from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@given(st.dictionaries(KEYS, VALUES, max_size=5))
def test_attrs_round_trip(attrs):
    text = format_attrs(attrs)
    back = parse_attrs(text)
    assert same(back, attrs), text
    assert format_attrs(back) == text


@pytest.mark.parametrize("value", [
    float("inf"), float("-inf"), -0.0, 1e-300, 5e-324, 1e16, 1e22, 2.5e-8, 10 ** 30, -(10 ** 30),
    'say "hi"\\', "ünïcødé 😀 \u2028", "", "\n\t", [[], [[]], {}], {"a": {"b": [None, True, -1]}},
])
def test_attr_value_round_trips(value):
    assert same(parse_attrs(format_attrs({"v": value}))["v"], value)


def test_nan_attr_round_trips():
    assert math.isnan(parse_attrs(format_attrs({"v": float("nan")}))["v"])


# -- names, locations and string attributes inside a function ------------------------------
NAME_TEXT = st.text(max_size=16)


@given(NAME_TEXT, NAME_TEXT, NAME_TEXT, NAME_TEXT, VALUES)
def test_function_with_arbitrary_names_round_trips(in_name, out_name, const_name, loc, attr):
    fn = Function("main", [in_name], [TensorType((2, 3))], [out_name])
    b = Builder(fn.body, loc=loc)
    c = b.constant(np.ones(3, np.float32), const_name)
    y = b.op("cuvil.add", fn.args[0], c)
    y.defining_op.attrs["note"] = attr  # an attribute the op does not use
    b.op_multi("cuvil.return", y)
    fn.attrs = {"arena_size": 64, "tag": attr}
    module = Module()
    module.add(fn)
    text = cir.print_module(module)
    assert cir.print_module(cir.parse_module(text, module.weights())) == text


# -- malformed text ---------------------------------------------------------------------
GOOD = '''func @main(%0: tensor<[2, 3], f32> "x") -> ("output") {
  %1 = cuvil.constant() {name = "c"} : tensor<[3], f32>
  %2 = cuvil.add(%0, %1) {} : tensor<[2, 3], f32> loc("m.py:3 in forward")
  cuvil.return(%2)
}
'''


def test_good_text_parses():
    module = cir.parse_module(GOOD)
    cir.verify(module)
    assert cir.print_module(module) == GOOD


@pytest.mark.parametrize("old, new", [
    ("(%0, %1)", "(%0, %7)"),                                       # undefined value
    ("cuvil.add", "cuvil.nope"),                                    # unknown op
    ("[2, 3], f32> loc", "[2, 3], q7> loc"),                        # unknown dtype
    ("[2, 3], f32> loc", "[-2, 3], f32> loc"),                      # negative dim
    ("%2 = cuvil.add", "%2, %3 = cuvil.add"),                       # too many results named
    ("{}", "{a = [}"),                                              # bad attribute
    ("{}", "{a = 1 b = 2}"),
    ("{}", "{1 = 2}"),
    ("{}", "{a = 0x10}"),
    ('-> ("output") {', '-> ("output") attributes {a = } {'),
    ("  cuvil.return(%2)\n}\n", "  cuvil.return(%2)\n"),            # unterminated function
    ("func @main", "fun @main"),
], ids=repr)
def test_malformed_text_raises_parse_error(old, new):
    assert old in GOOD
    with pytest.raises(ParseError):
        cir.parse_module(GOOD.replace(old, new))


@pytest.mark.parametrize("old, new", [
    ("{}", '{a = "\\q"}'),                                          # bad string escape
    ('"x"', '"\\q"'),                                               # bad escape in an input name
    ('("output")', "(output)"),                                     # output names not JSON
    ('() {name = "c"} : tensor<[3], f32>', "()"),                   # constant without a type
    ('{name = "c"}', "{}"),                                         # constant without a name
], ids=repr)
def test_malformed_text_raises_parse_error_more(old, new):
    assert old in GOOD
    with pytest.raises(ParseError):
        cir.parse_module(GOOD.replace(old, new))


@pytest.mark.parametrize("text", ["", "{a = 1", "{a = [1,", "{a = ", "{a = 1e}", "{a = -}", "{a = [1 2]}"])
def test_parse_attrs_rejects_malformed(text):
    with pytest.raises(ParseError):
        parse_attrs(text)


@pytest.mark.parametrize("text", ["{", "{a = [", "{a = {"])
def test_parse_attrs_rejects_text_ending_after_open_bracket(text):
    with pytest.raises(ParseError):
        parse_attrs(text)


def test_parse_attrs_rejects_trailing_text():
    with pytest.raises(ParseError, match="trailing"):
        parse_attrs("{a = 1} x")
