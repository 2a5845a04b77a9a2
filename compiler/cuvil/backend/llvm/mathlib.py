"""Float32 exp, log, tanh, erf, sigmoid, sin and cos written in plain LLVM IR arithmetic.

No libm calls and no branches: each function is straight-line code whose special
cases (inf, NaN, zero, overflow) are chosen with `select`. The functions are
`internal` and `alwaysinline`, so after inlining the loop that calls them is an
ordinary arithmetic loop that LLVM's loop vectoriser widens to the target's
vector width. Only intrinsics that every target lowers inline are used
(`fmuladd`, which fuses only where the target has FMA, `fabs`, `copysign`);
`fma`, `rint` and `floor` can become libm calls on baseline targets, so
rounding uses the 1.5 * 2**23 trick instead.

Polynomial coefficients are near-minimax fits (Lawson-weighted least squares on
Chebyshev nodes, float64, then rounded to float32); each comment gives the fitted
function, interval and the fit's error. Measured accuracy against float64 over
wide sweeps (see tests/backend/test_llvm_infra.py): exp and log about 1 ulp
relative, tanh/erf/sigmoid about 1e-7 absolute; sin and cos (argument reduction in
float64, Taylor polynomials in float32) within 2 ulp of 1.0 absolute for |x| < 1.6e6
(tests/ops/test_math_masks.py).
"""

from __future__ import annotations

from llvmlite import ir

F32 = ir.FloatType()
I32 = ir.IntType(32)
_PREFIX = "cuvil.math."

# x = n*ln2 + r with ln2 split so that n*LN2_HI is exact for |n| < 512.
_LOG2E = 1.44269504088896341
_LN2_HI = 0.693145751953125  # 0x3f317200: 15 significant bits
_LN2_LO = 1.42860676533018720e-06  # ln2 - _LN2_HI
_ROUND_MAGIC = 12582912.0  # 1.5 * 2**23: (v + M) - M rounds v to an integer, |v| < 2**22

# (exp(r) - 1 - r) / r**2 on [-ln2/2, ln2/2], degree 5 in r; relative error 2.7e-9.
_EXP_Q = (
    0.5000000013385633, 0.16666666532286295, 0.041666465466443106,
    0.008333360729331916, 0.0013933604392857507, 0.00019857797692393898,
)
# (log1p(f) - f + f*f/2) / s - f*f/2 = sum 2 z**k / (2k + 1), z = s**2, s = f / (2 + f):
# the atanh series, truncated after z**4 (next term < 5e-9 * s for |s| < 0.172).
_LOG_R = (2.0 / 3.0, 2.0 / 5.0, 2.0 / 7.0, 2.0 / 9.0)
# (tanh(x) - x) / x**3 on [0, 0.625], degree 4 in x**2; relative error 1.3e-7.
_TANH_P = (
    -0.3333332948684575, 0.13332788362210596, -0.05385262980769149,
    0.0210030573744694, -0.00610340702498564,
)
_TANH_SMALL = 0.625
# erf(x) / x on [0, 1], degree 6 in x**2; relative error 1.2e-9.
_ERF_P = (
    1.1283791657322926, -0.376126258396057, 0.11283585269684307, -0.026853816032006858,
    0.005188334439281306, -0.0008010247160993576, 7.854024807229151e-05,
)
# erfcx(x) = exp(x**2) * erfc(x) on [1, 4], degree 6 in t = 1 / (1 + x); abs error 1.6e-8.
_ERFCX_P = (
    -0.000396477198973464, 0.5731674514535676, 0.47922335695661294, 0.7116245961181585,
    -1.485443080247269, 0.9002590939737927, -0.16995033404895152,
)
_ERF_ONE = 4.0  # erf(x) rounds to 1.0f for x >= 3.92
# sin/cos: x = n pi/2 + r, |r| <= pi/4, computed in float64. _PIO2_HI is pi/2 with its
# low 20 mantissa bits cleared (33 significant bits), so n * _PIO2_HI is exact for
# |n| < 2**20, i.e. |x| < 1.6e6; _PIO2_LO = pi/2 - _PIO2_HI. Beyond that the reduction
# error grows like |x| * 2**-53 / 1e-11 relative; |x| >= 2**50 is reduced as 0.
_TWO_OVER_PI = 0.6366197723675814
_PIO2_HI = 1.5707963267341256  # 0x3ff921fb54400000
_PIO2_LO = 6.077100506506192e-11
_ROUND_MAGIC_D = 6755399441055744.0  # 1.5 * 2**52: rounds a double with |v| < 2**51
_TRIG_LIMIT = 2.0 ** 50
# Taylor series on |r| <= pi/4: (sin(r) - r) / r**3 in z = r**2 through r**9 (first term
# left out: 1.8e-9), cos(r) through r**10 (first term left out: 1.2e-10).
_SIN_P = (-1.0 / 6.0, 1.0 / 120.0, -1.0 / 5040.0, 1.0 / 362880.0)
_COS_P = (1.0, -0.5, 1.0 / 24.0, -1.0 / 720.0, 1.0 / 40320.0, -1.0 / 3628800.0)


class _Emit:
    """Short names for the float/int builder calls the formulas below need, on f32
    scalars or on vectors of `lanes` f32 (constants splatted, intrinsics declared for
    the vector type)."""

    def __init__(self, builder: ir.IRBuilder, lanes: int = 1):
        self.b = builder
        self.fty = F32 if lanes == 1 else ir.VectorType(F32, lanes)
        self.ity = I32 if lanes == 1 else ir.VectorType(I32, lanes)
        self.lanes = lanes
        module = builder.module
        # the overloaded intrinsics by their full names (llvmlite cannot name a vector
        # type's overload)
        t = self.fty
        suffix = "f32" if lanes == 1 else f"v{lanes}f32"

        def declare(name, arity):
            full = f"{name}.{suffix}"
            return module.globals.get(full) or ir.Function(module, ir.FunctionType(t, [t] * arity), name=full)
        self._fmuladd = declare("llvm.fmuladd", 3)
        self._fabs = declare("llvm.fabs", 1)
        self._copysign = declare("llvm.copysign", 2)

    def f(self, value: float) -> ir.Constant:
        return ir.Constant(self.fty, value if self.lanes == 1 else [value] * self.lanes)

    def i(self, value: int) -> ir.Constant:
        return ir.Constant(self.ity, value if self.lanes == 1 else [value] * self.lanes)

    def add(self, a, b):
        return self.b.fadd(a, b)

    def sub(self, a, b):
        return self.b.fsub(a, b)

    def mul(self, a, b):
        return self.b.fmul(a, b)

    def div(self, a, b):
        return self.b.fdiv(a, b)

    def muladd(self, a, b, c):
        """a * b + c, fused where the target has FMA."""
        return self.b.call(self._fmuladd, [a, b, c])

    def poly(self, x, coeffs):
        """coeffs[0] + coeffs[1] x + ... (Horner)."""
        acc = self.f(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.muladd(acc, x, self.f(c))
        return acc

    def fabs(self, x):
        return self.b.call(self._fabs, [x])

    def copysign(self, mag, sign):
        return self.b.call(self._copysign, [mag, sign])

    def lt(self, a, b):
        """Ordered a < b: false when either is NaN."""
        return self.b.fcmp_ordered("<", a, b)

    def select(self, cond, a, b):
        return self.b.select(cond, a, b)

    def is_nan(self, x):
        return self.b.fcmp_unordered("uno", x, x)

    def to_bits(self, x):
        return self.b.bitcast(x, self.ity)

    def from_bits(self, n):
        return self.b.bitcast(n, self.fty)


def _pow2(e: _Emit, n: ir.Value) -> ir.Value:
    """2.0**n for an i32 n in [-126, 127], built from the exponent bits."""
    return e.from_bits(e.b.shl(e.b.add(n, e.i(127)), e.i(23)))


def _exp(e: _Emit, x: ir.Value) -> ir.Value:
    # Clamp first (NaN goes to the upper bound and is restored at the end), so
    # the integer n below is always in range and never poison.
    xc = e.select(e.lt(x, e.f(89.0)), x, e.f(89.0))  # exp(89) overflows to inf
    xc = e.select(e.lt(e.f(-105.0), xc), xc, e.f(-105.0))  # exp(-105) rounds to 0
    nf = e.sub(e.muladd(xc, e.f(_LOG2E), e.f(_ROUND_MAGIC)), e.f(_ROUND_MAGIC))
    r = e.muladd(nf, e.f(-_LN2_HI), xc)  # exact
    r = e.muladd(nf, e.f(-_LN2_LO), r)
    p = e.add(e.muladd(e.mul(r, r), e.poly(r, _EXP_Q), r), e.f(1.0))
    # Scale by 2**n in two steps so n in [-152, 129] neither overflows the
    # exponent field nor skips gradual underflow.
    n = e.b.fptosi(nf, e.ity)
    n_half = e.b.ashr(n, e.i(1))
    y = e.mul(e.mul(p, _pow2(e, n_half)), _pow2(e, e.b.sub(n, n_half)))
    return e.select(e.is_nan(x), x, y)


def _log(e: _Emit, x: ir.Value) -> ir.Value:
    # Subnormals: scale into the normal range and correct the exponent.
    tiny = e.lt(x, e.f(1.1754943508222875e-38))
    xs = e.select(tiny, e.mul(x, e.f(8388608.0)), x)
    k_adjust = e.select(tiny, e.i(-23), e.i(0))
    # x = 2**k * m with m in [sqrt(1/2), sqrt(2)): offset the bits so the
    # exponent field rolls over at sqrt(2) instead of 2.
    sqrt_half_bits = 0x3F3504F3
    bits = e.b.add(e.to_bits(xs), e.i(0x3F800000 - sqrt_half_bits))
    k = e.b.add(e.b.sub(e.b.ashr(bits, e.i(23)), e.i(127)), k_adjust)
    m = e.from_bits(e.b.add(e.b.and_(bits, e.i(0x007FFFFF)), e.i(sqrt_half_bits)))
    f = e.sub(m, e.f(1.0))  # exact
    # log1p(f) = f - (hfsq - s * (hfsq + R)), s = f / (2 + f), hfsq = f*f/2.
    s = e.div(f, e.add(f, e.f(2.0)))
    z = e.mul(s, s)
    big_r = e.mul(z, e.poly(z, _LOG_R))
    hfsq = e.mul(e.mul(f, f), e.f(0.5))
    dk = e.b.sitofp(k, e.fty)
    tail = e.sub(hfsq, e.muladd(s, e.add(hfsq, big_r), e.mul(dk, e.f(_LN2_LO))))
    y = e.muladd(dk, e.f(_LN2_HI), e.sub(f, tail))
    inf = e.f(float("inf"))
    y = e.select(e.b.fcmp_ordered("==", x, inf), inf, y)
    y = e.select(e.b.fcmp_ordered("==", x, e.f(0.0)), e.f(float("-inf")), y)
    y = e.select(e.lt(x, e.f(0.0)), e.f(float("nan")), y)
    return e.select(e.is_nan(x), x, y)


def _tanh(e: _Emit, x: ir.Value) -> ir.Value:
    a = e.fabs(x)
    # Small |x|: x + x**3 P(x**2), accurate relative to tanh itself.
    x2 = e.mul(x, x)
    small = e.muladd(e.mul(x, x2), e.poly(x2, _TANH_P), x)
    small = e.copysign(small, x)  # tanh(-0) = -0
    # Large |x|: 1 - 2 / (exp(2|x|) + 1); exp overflows to inf and this gives 1.
    big = e.sub(e.f(1.0), e.div(e.f(2.0), e.add(_exp(e, e.add(a, a)), e.f(1.0))))
    big = e.copysign(big, x)
    return e.select(e.lt(a, e.f(_TANH_SMALL)), small, big)  # NaN takes `big`: NaN


def _erf(e: _Emit, x: ir.Value) -> ir.Value:
    a = e.fabs(x)
    # x * P(x**2) as x + x * (P(x**2) - 1): the leading 1.128... then costs no
    # float32 rounding of its own.
    small = e.muladd(x, e.poly(e.mul(x, x), (_ERF_P[0] - 1.0, *_ERF_P[1:])), x)
    # |x| >= 1: erf = 1 - exp(-x**2) erfcx(x); beyond 4 the result is 1.0f.
    ac = e.select(e.lt(a, e.f(_ERF_ONE)), a, e.f(_ERF_ONE))
    t = e.div(e.f(1.0), e.add(ac, e.f(1.0)))
    erfc = e.mul(_exp(e, e.b.fneg(e.mul(ac, ac))), e.poly(t, _ERFCX_P))
    big = e.copysign(e.sub(e.f(1.0), erfc), x)
    y = e.select(e.lt(a, e.f(1.0)), small, big)
    return e.select(e.is_nan(x), x, y)


def _sigmoid(e: _Emit, x: ir.Value) -> ir.Value:
    # exp(-x) is finite or +inf for finite x, so this is never NaN: 1/(1+inf) = 0.
    return e.div(e.f(1.0), e.add(e.f(1.0), _exp(e, e.b.fneg(x))))


def _reduce_pio2(e: _Emit, x: ir.Value):
    """(r, n): x = n pi/2 + r with r as float32 and n's low 32 bits as i32 (float64 inside;
    non-finite and |x| >= _TRIG_LIMIT are reduced as 0 and fixed by the caller)."""
    b = e.b
    dty = ir.DoubleType() if e.lanes == 1 else ir.VectorType(ir.DoubleType(), e.lanes)
    i64ty = ir.IntType(64) if e.lanes == 1 else ir.VectorType(ir.IntType(64), e.lanes)

    def d(v):
        return ir.Constant(dty, v if e.lanes == 1 else [v] * e.lanes)
    ok = e.lt(e.fabs(x), e.f(_TRIG_LIMIT))
    xd = b.select(ok, b.fpext(x, dty), d(0.0))
    nf = b.fsub(b.fadd(b.fmul(xd, d(_TWO_OVER_PI)), d(_ROUND_MAGIC_D)), d(_ROUND_MAGIC_D))
    r = b.fsub(b.fsub(xd, b.fmul(nf, d(_PIO2_HI))), b.fmul(nf, d(_PIO2_LO)))
    n = b.trunc(b.fptosi(nf, i64ty), e.ity)
    return b.fptrunc(r, e.fty), n


def _sin_quadrant(e: _Emit, x: ir.Value, shift: int) -> ir.Value:
    """sin(x + shift * pi/2): sin for shift 0, cos for shift 1."""
    r, n = _reduce_pio2(e, x)
    z = e.mul(r, r)
    s = e.muladd(e.mul(r, z), e.poly(z, _SIN_P), r)
    c = e.poly(z, _COS_P)
    q = e.b.add(n, e.i(shift))
    zero = e.i(0)
    v = e.select(e.b.icmp_signed("!=", e.b.and_(q, e.i(1)), zero), c, s)
    v = e.select(e.b.icmp_signed("!=", e.b.and_(q, e.i(2)), zero), e.b.fneg(v), v)
    v = e.select(e.lt(e.fabs(x), e.f(float("inf"))), v, e.f(float("nan")))  # inf, NaN
    if shift == 0:  # sin(-0) = -0
        v = e.select(e.b.fcmp_ordered("==", x, e.f(0.0)), x, v)
    return v


def _sin(e: _Emit, x: ir.Value) -> ir.Value:
    return _sin_quadrant(e, x, 0)


def _cos(e: _Emit, x: ir.Value) -> ir.Value:
    return _sin_quadrant(e, x, 1)


_FORMULAS = {
    "exp": _exp,
    "log": _log,
    "tanh": _tanh,
    "erf": _erf,
    "sigmoid": _sigmoid,
    "sin": _sin,
    "cos": _cos,
}
NAMES = frozenset(_FORMULAS)


def get_math(module: ir.Module, name: str, lanes: int = 1) -> ir.Function:
    """The scalar `float name(float)` in `module` (with `lanes` > 1, the same formula on
    `<lanes x float>`: for code that holds its values in vectors), defined on first use.

    Returns the same function on later calls. The function is internal and
    alwaysinline; call the scalar one from a loop and LLVM vectorises the loop.
    """
    if name not in _FORMULAS:
        raise KeyError(f"no float32 math function {name!r}; have {sorted(NAMES)}")
    symbol = f"{_PREFIX}{name}f" + (f".v{lanes}" if lanes > 1 else "")
    existing = module.globals.get(symbol)
    if existing is not None:
        return existing
    ty = F32 if lanes == 1 else ir.VectorType(F32, lanes)
    fn = ir.Function(module, ir.FunctionType(ty, [ty]), symbol)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    builder.ret(_FORMULAS[name](_Emit(builder, lanes), fn.args[0]))
    return fn
