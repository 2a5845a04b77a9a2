"""Symbolic dims: a dim is an int or a polynomial in named symbols with integer
coefficients, written in one canonical text form (`batch`, `12*batch*seq_len`,
`seq_len+1`).

Dynamic shapes give each symbolic input dim a name and bounds (`batch: [1, 32]`); every
other dim is derived from those by the ops' shape rules, which multiply (reshape to
[B*S, H]) and add (concat) dims. Polynomials are closed under both, so the IR can say
exactly which runtime size every tensor has; the backend evaluates them from the input
shapes when the model runs. The canonical text makes equal dims equal strings, so
types compare, hash and print as before.
"""
from __future__ import annotations

import re
from math import prod
from typing import Iterable, Mapping

from ..errors import ParseError

# A polynomial: monomial (sorted tuple of symbol names, with repeats) -> coefficient.
Poly = dict[tuple[str, ...], int]
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TERM = re.compile(r"\s*([+-]?)\s*([^+-]+)")


def _poly_of(d) -> Poly:
    if isinstance(d, bool):
        raise TypeError(f"bad dim {d!r}")
    if isinstance(d, int):
        return {(): d} if d else {}
    if isinstance(d, str):
        return parse(d)
    raise TypeError(f"bad dim {d!r}")


def parse(text: str) -> Poly:
    """The polynomial of a dim's text form; raises ParseError on anything else."""
    src = text.replace(" ", "")
    if not src:
        raise ParseError("empty dim")
    poly: Poly = {}
    pos = 0
    for m in _TERM.finditer(src):
        if m.start() != pos:
            break
        pos = m.end()
        coeff, syms = -1 if m.group(1) == "-" else 1, []
        for factor in m.group(2).split("*"):
            if factor.isdigit():
                coeff *= int(factor)
            elif _NAME.match(factor):
                syms.append(factor)
            else:
                raise ParseError(f"bad symbolic dim {text!r}")
        key = tuple(sorted(syms))
        poly[key] = poly.get(key, 0) + coeff
    if pos != len(src):
        raise ParseError(f"bad symbolic dim {text!r}")
    return {k: c for k, c in poly.items() if c}


def _fmt(poly: Poly) -> int | str:
    poly = {k: c for k, c in poly.items() if c}
    if not poly:
        return 0
    if set(poly) == {()}:
        return poly[()]
    terms = []
    # Highest degree first, then by name; the constant last.
    for key in sorted(poly, key=lambda k: (-len(k), k)):
        c = poly[key]
        body = "*".join(key)
        if not key:
            text = str(abs(c))
        elif abs(c) == 1:
            text = body
        else:
            text = f"{abs(c)}*{body}"
        terms.append(("-" if c < 0 else "+", text))
    out = ("-" if terms[0][0] == "-" else "") + terms[0][1]
    for sign, text in terms[1:]:
        out += sign + text
    return out


def canonical(d) -> int | str:
    """An int, or the canonical text of a symbolic dim."""
    return _fmt(_poly_of(d))


def add(a, b) -> int | str:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    pa, pb = _poly_of(a), _poly_of(b)
    for k, c in pb.items():
        pa[k] = pa.get(k, 0) + c
    return _fmt(pa)


def sub(a, b) -> int | str:
    return add(a, mul(b, -1))


def mul(a, b) -> int | str:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    out: Poly = {}
    for ka, ca in _poly_of(a).items():
        for kb, cb in _poly_of(b).items():
            k = tuple(sorted(ka + kb))
            out[k] = out.get(k, 0) + ca * cb
    return _fmt(out)


def product(dims: Iterable) -> int | str:
    out: int | str = 1
    for d in dims:
        out = mul(out, d)
    return out


def exact_div(a, b) -> int | str | None:
    """a / b when b divides a exactly (an int, or a single monomial), else None."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b if b and a % b == 0 else None
    pb = _poly_of(b)
    if len(pb) != 1:
        return None
    (kb, cb), = pb.items()
    out: Poly = {}
    for ka, ca in _poly_of(a).items():
        rest = list(ka)
        for s in kb:
            if s not in rest:
                return None
            rest.remove(s)
        if ca % cb:
            return None
        out[tuple(rest)] = ca // cb
    return _fmt(out)


def symbols(d) -> set[str]:
    if isinstance(d, int):
        return set()
    return {s for k in _poly_of(d) for s in k}


def evaluate(d, env: Mapping[str, int]) -> int:
    """The value of a dim with every symbol bound in `env`."""
    if isinstance(d, int):
        return d
    total = 0
    for k, c in _poly_of(d).items():
        missing = [s for s in k if s not in env]
        if missing:
            raise KeyError(f"symbol {missing[0]!r} of dim {d!r} has no value")
        total += c * prod(int(env[s]) for s in k)
    return total


def _extreme(d, bounds: Mapping[str, tuple[int, int]], largest: bool) -> int:
    if isinstance(d, int):
        return d
    total = 0
    for k, c in _poly_of(d).items():
        pick = 1 if (c > 0) == largest else 0
        total += c * prod(int(bounds[s][pick]) for s in k)
    return total


def upper_bound(d, bounds: Mapping[str, tuple[int, int]]) -> int:
    """The largest value of a dim over the symbols' [lo, hi] ranges (every symbol is
    positive, so a term with a positive coefficient is largest at hi, one with a
    negative coefficient at lo)."""
    return _extreme(d, bounds, largest=True)


def lower_bound(d, bounds: Mapping[str, tuple[int, int]]) -> int:
    return _extreme(d, bounds, largest=False)


def bind(d, env: Mapping[str, int]) -> int | str:
    """A dim with the symbols in `env` replaced by their values (the others stay)."""
    if isinstance(d, int) or not env:
        return d
    out: Poly = {}
    for key, c in _poly_of(d).items():
        rest = []
        for s in key:
            if s in env:
                c *= int(env[s])
            else:
                rest.append(s)
        out[tuple(rest)] = out.get(tuple(rest), 0) + c
    return _fmt(out)


def substitute(shape, env: Mapping[str, int]) -> list[int]:
    """A shape with every symbolic dim evaluated."""
    return [evaluate(d, env) for d in shape]
