"""Parser for the IR text form written by printer.py. Errors name the line."""
from __future__ import annotations

import json
import re

import numpy as np

from ..errors import ParseError
from . import ops  # noqa: F401  (registers ops)
from .core import OP_REGISTRY, Function, Module
from .ops.shape import Constant
from .types import TensorType

_TYPE = r"tensor<\[[^\]]*\],\s*\w+(?:,\s*\w+)?>"
_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>-?(?:inf|\d[\w.+-]*))'
                    r'|(?P<word>[A-Za-z_][\w.]*)|(?P<punct>[{}\[\],=]))')
_FUNC = re.compile(r"func @(\w+)\((.*)\) -> \((.*?)\)(?: attributes (\{.*\}))? \{\Z")
_ARG = re.compile(rf'(%\d+): ({_TYPE}) ("(?:[^"\\]|\\.)*")')
MAX_DEPTH = 64  # nested lists and dicts in attributes; nested regions

_OP = re.compile(rf'(?:(?P<res>%\d+(?:, %\d+)*) = )?(?P<name>[\w.]+)\((?P<args>[^)]*)\)'
                 rf'(?: (?P<attrs>\{{.*\}}) : (?P<types>{_TYPE}(?:, {_TYPE})*)'
                 rf'(?: loc\((?P<loc>"(?:[^"\\]|\\.)*")\))?)?\Z')


class _Attrs:
    """Recursive-descent reader for attribute dicts."""

    def __init__(self, text: str, line: int):
        self.toks = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise ParseError(f"line {line}: bad attribute text near {text[pos:pos + 20]!r}")
            self.toks.append((m.lastgroup, m.group(m.lastgroup)))
            pos = m.end()
        self.i, self.line, self.depth = 0, line, 0

    def next(self):
        if self.i >= len(self.toks):
            raise ParseError(f"line {self.line}: attribute text ends early")
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, punct: str):
        kind, val = self.next()
        if val != punct:
            raise ParseError(f"line {self.line}: expected {punct!r}, got {val!r}")

    def value(self):
        kind, val = self.next()
        if kind == "str":
            return json.loads(val)
        if kind == "num":
            if val in ("inf", "-inf"):
                return float(val)
            try:
                return int(val) if re.fullmatch(r"-?\d+", val) else float(val)
            except ValueError:
                raise ParseError(f"line {self.line}: bad number {val!r}") from None
        if kind == "word":
            consts = {"true": True, "false": False, "none": None, "nan": float("nan"), "inf": float("inf")}
            if val in consts:
                return consts[val]
            raise ParseError(f"line {self.line}: unexpected word {val!r}")
        if val in ("[", "{"):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ParseError(f"line {self.line}: attributes nested more than {MAX_DEPTH} levels deep")
            try:
                return self._container(val)
            finally:
                self.depth -= 1
        raise ParseError(f"line {self.line}: unexpected {val!r}")

    def _container(self, val):
        if val == "[":
            items = []
            if self.toks[self.i][1] == "]":
                self.i += 1
                return items
            while True:
                items.append(self.value())
                kind, val = self.next()
                if val == "]":
                    return items
                if val != ",":
                    raise ParseError(f"line {self.line}: expected ',' or ']' in list, got {val!r}")
        self.i -= 1
        return self.dict()

    def dict(self):
        self.expect("{")
        out = {}
        if self.toks[self.i][1] == "}":
            self.i += 1
            return out
        while True:
            kind, key = self.next()
            if kind != "word":
                raise ParseError(f"line {self.line}: expected an attribute name, got {key!r}")
            self.expect("=")
            out[key] = self.value()
            kind, val = self.next()
            if val == "}":
                return out
            if val != ",":
                raise ParseError(f"line {self.line}: expected ',' or '}}', got {val!r}")


def parse_attrs(text: str, line: int = 0) -> dict:
    reader = _Attrs(text, line)
    try:
        out = reader.dict()
    except IndexError:
        raise ParseError(f"line {line}: attribute text ends early") from None
    if reader.i != len(reader.toks):
        raise ParseError(f"line {line}: trailing text after attributes")
    return out


def parse_module(text: str, weights: dict[str, np.ndarray] | None = None) -> Module:
    """Parse IR text. Constants get their arrays from `weights` (by name); without it
    they get zero arrays of their type (for text-only golden tests)."""
    state = _ParseState()
    for lineno, raw in enumerate(text.splitlines(), 1):
        try:
            _parse_line(state, raw.strip(), lineno, weights)
        except ParseError as e:
            if str(e).startswith("line "):
                raise
            raise ParseError(f"line {lineno}: {e}") from None
        except (ValueError, KeyError, IndexError, TypeError) as e:  # json, attrs, types
            raise ParseError(f"line {lineno}: {type(e).__name__}: {e}") from None
    if state.fn is not None or state.awaiting is not None:
        raise ParseError("unexpected end of text inside a function")
    return state.module


class _ParseState:
    def __init__(self):
        self.module = Module()
        self.fn: Function | None = None
        self.values: dict[str, object] = {}
        # Inside `regions { ... }` of this op of `fn` (between its regions' functions).
        self.awaiting = None
        # The functions holding the regions being parsed: (fn, values, op), outermost first.
        self.stack: list[tuple] = []


def _parse_line(state: _ParseState, line: str, lineno: int, weights) -> None:
    if not line or line.startswith("//"):
        return
    if state.fn is None or state.awaiting is not None:
        if state.awaiting is not None and line == "}":  # the end of an op's regions
            state.awaiting = None
            return
        _start_function(state, line, lineno)
        return
    if line == "}":
        fn = state.fn
        if state.stack:  # a region: back to the op that holds it
            state.fn, state.values, state.awaiting = state.stack.pop()
            state.awaiting.regions.append(fn)
        else:
            state.module.add(fn)
            state.fn = None
        return
    opens = line.endswith(" regions {")
    op = _parse_op(state, line[:-len(" regions {")] if opens else line, lineno, weights)
    if opens:
        state.awaiting = op


def _start_function(state: _ParseState, line: str, lineno: int) -> None:
    m = _FUNC.match(line)
    if not m:
        raise ParseError(f"line {lineno}: expected 'func @name(...) -> (...) {{'")
    args = [a for a in _ARG.finditer(m.group(2))]
    outs = json.loads(f"[{m.group(3)}]")
    fn = Function(m.group(1), [json.loads(a.group(3)) for a in args],
                  [TensorType.parse(a.group(2)) for a in args], outs)
    if state.awaiting is not None:  # a region of the awaiting op
        if len(state.stack) >= MAX_DEPTH:
            raise ParseError(f"line {lineno}: regions nested more than {MAX_DEPTH} levels deep")
        state.stack.append((state.fn, state.values, state.awaiting))
        state.awaiting = None
    state.fn, state.values = fn, {a.group(1): v for a, v in zip(args, fn.args)}
    if m.group(4):
        fn.attrs = parse_attrs(m.group(4), lineno)


def _parse_op(state: _ParseState, line: str, lineno: int, weights):
    fn, values = state.fn, state.values
    m = _OP.match(line)
    if not m:
        raise ParseError(f"line {lineno}: cannot parse {line[:60]!r}")
    name = m.group("name")
    cls = OP_REGISTRY.get(name)
    if cls is None:
        raise ParseError(f"line {lineno}: unknown op {name!r}")
    try:
        operands = [values[a.strip()] for a in m.group("args").split(",") if a.strip()]
    except KeyError as e:
        raise ParseError(f"line {lineno}: use of undefined value {e.args[0]}") from None
    attrs = parse_attrs(m.group("attrs"), lineno) if m.group("attrs") else {}
    types = [TensorType.parse(t) for t in re.findall(_TYPE, m.group("types") or "")]
    loc = json.loads(m.group("loc")) if m.group("loc") else ""
    if cls is Constant:
        arr = (weights or {}).get(attrs.get("name"))
        if arr is None:
            if weights is not None:
                raise ParseError(f"line {lineno}: no weight named {attrs.get('name')!r} in the bundle")
            arr = np.zeros(types[0].shape, types[0].np_dtype)
        op = Constant(arr, attrs["name"], loc)
    else:
        op = cls(operands, attrs, types, loc)
    fn.body.append(op)
    results = (m.group("res") or "").split(", ") if m.group("res") else []
    if len(results) != len(op.results):
        raise ParseError(f"line {lineno}: {name} has {len(op.results)} results, {len(results)} named")
    for r, v in zip(results, op.results):
        values[r] = v
    return op
