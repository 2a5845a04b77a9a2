"""Elementwise math ATen ops lowered as compositions of the IR's elementwise ops (so
that fusion puts each into one vectorised loop): rounding (trunc, floor, ceil, round
with decimals, sign), trigonometry and hyperbolics (tan, atan, atan2, asin, acos, sinh,
cosh), expm1, log1p, erfinv, fmod, remainder and division with a rounding mode. Registered into the same HANDLERS table
as torch_ops.

The rounding ops convert through int64 where |x| < 2**23 (2**52 in float64: above that
every value is an integer already; NaN and inf pass through). atan follows the classic three-interval
reduction (|x| <= tan(pi/8), <= tan(3pi/8), beyond) with an odd polynomial; asin and
acos are atan of an exact ratio; erfinv is Giles' single-precision approximation
("Approximating the erfinv function", 2010).
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import Value
from ..ir.types import FLOAT_DTYPES
from .torch_ops import handles


class _Ops:
    """Short names for building an elementwise expression in one dtype."""

    def __init__(self, low, dtype: str):
        self.low, self.dtype = low, dtype

    def c(self, v) -> Value:
        return self.low.const(np.asarray(v, np.float64), self.dtype)

    def v(self, x) -> Value:
        if isinstance(x, str):  # a symbolic size used as a number
            x = self.low.op("cuvil.dim", dims=[x])
        return self.low.cast(x, self.dtype) if isinstance(x, Value) else self.c(x)

    def __getattr__(self, name):
        op = f"cuvil.{name.rstrip('_')}"  # and_, or_: Python keywords
        return lambda *xs, **attrs: self.low.op(op, *[self.v(x) if not isinstance(x, Value) else x for x in xs],
                                                 **attrs)


def _float_out(low) -> str:
    dtype = low.meta_type().dtype
    return dtype if dtype in FLOAT_DTYPES else "f32"


def _self(a):
    return a["self"] if "self" in a else a["input"]


_EXACT = {"f16": 2.0 ** 10, "f32": 2.0 ** 23, "f64": 2.0 ** 52}  # from here on every value is an integer


def trunc(o: _Ops, x: Value) -> Value:
    small = o.lt(o.abs(x), _EXACT[o.dtype])
    t = o.low.cast(o.low.cast(o.where(small, x, o.c(0.0)), "i64"), o.dtype)
    return o.where(small, t, x)


@handles("trunc", "fix", "floor", "ceil", "sign", "sgn", "frac")
def _rounding(low, a):
    x = _self(a)
    which = low.node.target._schema.name.split("::")[1]
    if x.dtype not in FLOAT_DTYPES and which != "sign":
        return x
    o = _Ops(low, low.meta_type().dtype)
    if which in ("sign", "sgn"):
        one, zero = o.c(1.0), o.c(0.0)
        return o.sub(o.where(o.gt(x, zero), one, zero), o.where(o.lt(x, zero), one, zero))  # NaN -> 0
    t = trunc(o, x)
    if which == "floor":
        return o.where(o.gt(t, x), o.sub(t, 1.0), t)
    if which == "ceil":
        return o.where(o.lt(t, x), o.add(t, 1.0), t)
    if which == "frac":
        return o.sub(x, t)
    return t


def round_half_even(o: _Ops, x: Value) -> Value:
    t = trunc(o, x)
    f = o.abs(o.sub(x, t))
    half = o.div(t, 2.0)
    odd = o.ne(trunc(o, half), half)
    step = o.where(o.lt(x, 0.0), o.c(-1.0), o.c(1.0))
    up = o.or_(o.gt(f, 0.5), o.and_(o.eq(f, 0.5), odd))
    return o.where(up, o.add(t, step), t)


@handles("round")
def _round(low, a):
    x = _self(a)
    if x.dtype not in FLOAT_DTYPES:
        return x
    o = _Ops(low, x.dtype)
    d = int(a.get("decimals") or 0)
    if d == 0:
        return round_half_even(o, x)
    scale = 10.0 ** abs(d)
    if d > 0:
        return o.div(round_half_even(o, o.mul(x, scale)), scale)
    return o.mul(round_half_even(o, o.div(x, scale)), scale)


def atan(o: _Ops, x: Value) -> Value:
    ax = o.abs(x)
    big, mid = o.gt(ax, 2.414213562373095), o.gt(ax, 0.4142135623730950)
    z = o.where(big, o.div(-1.0, ax), o.where(mid, o.div(o.sub(ax, 1.0), o.add(ax, 1.0)), ax))
    base = o.where(big, o.c(math.pi / 2), o.where(mid, o.c(math.pi / 4), o.c(0.0)))
    z2 = o.mul(z, z)
    p = o.c(8.05374449538e-2)
    for coef in (-1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1):
        p = o.add(o.mul(p, z2), coef)
    r = o.add(base, o.add(o.mul(o.mul(p, z2), z), z))
    return o.where(o.lt(x, 0.0), o.neg(r), r)


@handles("atan", "arctan")
def _atan(low, a):
    return atan(_Ops(low, _float_out(low)), low.cast(_self(a), _float_out(low)))


@handles("atan2", "arctan2")
def _atan2(low, a):
    o = _Ops(low, _float_out(low))
    y, x = o.v(a["self"]), o.v(a["other"])
    r = atan(o, o.div(y, x))
    r = o.where(o.lt(x, 0.0), o.add(r, o.where(o.lt(y, 0.0), o.c(-math.pi), o.c(math.pi))), r)
    return o.where(o.and_(o.eq(x, 0.0), o.eq(y, 0.0)), o.c(0.0), r)


@handles("asin", "arcsin", "acos", "arccos")
def _asin_acos(low, a):
    o = _Ops(low, _float_out(low))
    x = o.v(_self(a))
    if low.node.target._schema.name.split("::")[1] in ("asin", "arcsin"):
        return atan(o, o.div(x, o.sqrt(o.mul(o.sub(1.0, x), o.add(x, 1.0)))))
    return o.mul(atan(o, o.sqrt(o.div(o.sub(1.0, x), o.add(x, 1.0)))), 2.0)


@handles("tan")
def _tan(low, a):
    o = _Ops(low, _float_out(low))
    x = o.v(_self(a))
    return o.div(o.sin(x), o.cos(x))


@handles("sinh", "cosh")
def _sinh_cosh(low, a):
    o = _Ops(low, _float_out(low))
    x = o.v(_self(a))
    e, r = o.exp(x), o.exp(o.neg(x))
    if low.node.target._schema.name.endswith("sinh"):
        small = o.lt(o.abs(x), 0.03)  # x + x^3/6 + x^5/120: no cancellation near 0
        x2 = o.mul(x, x)
        series = o.mul(x, o.add(1.0, o.mul(x2, o.add(1.0 / 6, o.mul(x2, 1.0 / 120)))))
        return o.where(small, series, o.mul(o.sub(e, r), 0.5))
    return o.mul(o.add(e, r), 0.5)


@handles("expm1")
def _expm1(low, a):
    o = _Ops(low, _float_out(low))
    x = o.v(_self(a))
    small = o.lt(o.abs(x), 0.01)  # x + x^2/2 + x^3/6 + x^4/24
    series = o.mul(x, o.add(1.0, o.mul(x, o.add(0.5, o.mul(x, o.add(1.0 / 6, o.mul(x, 1.0 / 24)))))))
    return o.where(small, series, o.sub(o.exp(x), 1.0))


@handles("log1p")
def _log1p(low, a):
    o = _Ops(low, _float_out(low))
    x = o.v(_self(a))
    small = o.lt(o.abs(x), 0.01)  # x - x^2/2 + x^3/3 - x^4/4
    series = o.mul(x, o.sub(1.0, o.mul(x, o.sub(0.5, o.mul(x, o.sub(1.0 / 3, o.mul(x, 0.25)))))))
    return o.where(small, series, o.log(o.add(x, 1.0)))


_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                   -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


@handles("erfinv")
def _erfinv(low, a):
    o = _Ops(low, _float_out(low))
    x = o.v(_self(a))
    w = o.neg(o.log(o.mul(o.sub(1.0, x), o.add(x, 1.0))))

    def poly(coefs, t):
        p = o.c(coefs[0])
        for c in coefs[1:]:
            p = o.add(o.mul(p, t), c)
        return p
    central = poly(_ERFINV_CENTRAL, o.sub(w, 2.5))
    tail = poly(_ERFINV_TAIL, o.sub(o.sqrt(o.where(o.lt(w, 5.0), o.c(5.0), w)), 3.0))
    y = o.mul(o.where(o.lt(w, 5.0), central, tail), x)
    return o.where(o.eq(o.abs(x), 1.0), o.mul(x, float("inf")), y)  # the tail polynomial is -inf there


@handles("fmod", "remainder")
def _fmod(low, a):
    """fmod: a - trunc(a / b) * b; remainder: that plus b where the signs differ (torch's
    own definition). Integer operands are computed in float64 (exact below 2**53)."""
    dtype = low.meta_type().dtype
    o = _Ops(low, dtype if dtype in FLOAT_DTYPES else "f64")
    x, y = o.v(a["self"]), o.v(a["other"])
    m = o.sub(x, o.mul(trunc(o, o.div(x, y)), y))
    if low.node.target._schema.name.endswith("remainder"):
        fix = o.and_(o.ne(m, 0.0), o.ne(o.lt(y, 0.0), o.lt(m, 0.0)))
        m = o.where(fix, o.add(m, y), m)
    return low.cast(m, dtype)


@handles("div", "div_")
def _div(low, a):
    """True division, or rounded toward zero / down (rounding_mode 'trunc' / 'floor'),
    computed in the output's float dtype (f32 for integers, exact below 2**24)."""
    mode = a.get("rounding_mode")
    dtype = low.meta_type().dtype
    o = _Ops(low, dtype if dtype in FLOAT_DTYPES else "f32")
    q = o.div(o.v(a["self"]), o.v(a["other"]))
    if mode is not None:
        t = trunc(o, q)
        q = t if mode == "trunc" else o.where(o.gt(t, q), o.sub(t, 1.0), t)
    return low.cast(q, dtype)
