"""Runtime sizes for symbolic dims.

A kernel for a type with symbolic dims gets one more argument, `dims` (i64*: the
symbols' values for this run, in the module's symbol order). The emitters keep doing
their size arithmetic in Python: a symbolic dim is a `Size`, an expression that
supports + - * // % with ints and other Sizes and turns into an i64 where the code
needs a value (`emit.i64(size)`). It is computed once per function, in the entry
block, from the loaded symbols, so every use is dominated by it.

What a Size refuses is a compile-time decision its bounds do not settle: `if size:`
or `size < 4` answer when every value in [lo, hi] gives the same answer and raise
`SymbolicDecision` otherwise; an emitter then branches at run time or decides by
the bounds explicitly (`upper(size)`, the value at the symbols' upper bounds). An emitter that has
not been taught that meets the exception, and the user gets a BackendError naming
the op.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from llvmlite import ir

from ...ir import symdim

I64 = ir.IntType(64)


class SymbolicDecision(TypeError):
    """A compile-time decision on a size known only at run time."""


def _key(x):
    return x.key if isinstance(x, Size) else ("int", x)


class Size:
    """A size known at run time: `key` says how it is computed (("poly", dim text) or
    (op, key of a, key of b)), `args` are the operands of an op, `lo`/`hi` bound it."""

    __slots__ = ("key", "args", "lo", "hi")

    def __init__(self, key: tuple, lo: int, hi: int, args: tuple = ()):
        self.key, self.args, self.lo, self.hi = key, args, lo, hi

    # -- construction ----------------------------------------------------------------------
    @staticmethod
    def of(dim, bounds) -> "int | Size":
        """A Size for an IR dim (int dims stay ints)."""
        if isinstance(dim, int):
            return dim
        return Size(("poly", dim), symdim.lower_bound(dim, bounds), symdim.upper_bound(dim, bounds))

    @property
    def poly(self):
        return self.key[1] if self.key[0] == "poly" else None

    @staticmethod
    def _make(kind, a, b, lo, hi) -> "int | Size":
        if isinstance(a, int) and isinstance(b, int):
            return {"add": a + b, "mul": a * b, "div": a // b if b else 0, "mod": a % b if b else 0,
                    "min": min(a, b), "max": max(a, b)}[kind]
        pa = a if isinstance(a, int) else a.poly
        pb = b if isinstance(b, int) else b.poly
        if kind in ("add", "mul") and pa is not None and pb is not None:
            poly = symdim.add(pa, pb) if kind == "add" else symdim.mul(pa, pb)
            return poly if isinstance(poly, int) else Size(("poly", poly), lo, hi)
        if kind == "div" and pa is not None and isinstance(b, int):
            q = symdim.exact_div(pa, b)
            if q is not None:
                return q if isinstance(q, int) else Size(("poly", q), lo, hi)
        return Size((kind, _key(a), _key(b)), lo, hi, (a, b))

    def __add__(self, o):
        if isinstance(o, int) and o == 0:
            return self
        return Size._make("add", self, o, self.lo + _lo(o), self.hi + _hi(o))

    __radd__ = __add__

    def __neg__(self):
        return self * -1

    def __sub__(self, o):
        return self + (-o)

    def __rsub__(self, o):
        return (-self) + o

    def __mul__(self, o):
        if isinstance(o, int) and o in (0, 1):
            return self if o else 0
        cands = [self.lo * _lo(o), self.lo * _hi(o), self.hi * _lo(o), self.hi * _hi(o)]
        return Size._make("mul", self, o, min(cands), max(cands))

    __rmul__ = __mul__

    def __floordiv__(self, o):
        if isinstance(o, int) and o == 1:
            return self
        if isinstance(o, int) and o > 0:
            return Size._make("div", self, o, self.lo // o, self.hi // o)
        if isinstance(o, Size) and o.lo > 0:
            return Size._make("div", self, o, self.lo // o.hi, self.hi // o.lo)
        raise SymbolicDecision(f"division of the runtime size {self} by {o!r}")

    def __rfloordiv__(self, o):
        if isinstance(o, int) and self.lo > 0:
            return Size._make("div", o, self, o // self.hi, o // self.lo)
        raise SymbolicDecision(f"division by the runtime size {self}, which may be 0")

    def __mod__(self, o):
        if isinstance(o, int) and o > 0:
            if self.poly is not None and symdim.exact_div(self.poly, o) is not None:
                return 0
            return Size._make("mod", self, o, 0, o - 1)
        if isinstance(o, Size) and o.lo > 0:
            return Size._make("mod", self, o, 0, o.hi - 1)
        raise SymbolicDecision(f"remainder of the runtime size {self} by {o!r}")

    # -- compile-time decisions only where the bounds settle them -----------------------------
    def __bool__(self):
        if self.lo > 0 or self.hi < 0:
            return True
        if self.lo == self.hi == 0:
            return False
        raise SymbolicDecision(f"a compile-time decision on the runtime size {self} (in [{self.lo}, {self.hi}])")

    def _decide(self, o, op):
        lo, hi = self.lo - _hi(o), self.hi - _lo(o)  # bounds of self - o
        verdict = {"<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0),
                   ">": (lo > 0, hi <= 0), ">=": (lo >= 0, hi < 0)}[op]
        if verdict[0]:
            return True
        if verdict[1]:
            return False
        raise SymbolicDecision(f"a compile-time comparison {self} {op} {o} (the size is in [{self.lo}, {self.hi}])")

    def __lt__(self, o):
        return self._decide(o, "<")

    def __le__(self, o):
        return self._decide(o, "<=")

    def __gt__(self, o):
        return self._decide(o, ">")

    def __ge__(self, o):
        return self._decide(o, ">=")

    def __eq__(self, o):
        return isinstance(o, Size) and o.key == self.key

    def __ne__(self, o):
        return not self.__eq__(o)

    def __hash__(self):
        return hash(self.key)

    def __index__(self):
        raise SymbolicDecision(f"the runtime size {self} used as a compile-time integer")

    def __repr__(self):
        if self.poly is not None:
            return str(self.poly)
        return f"{self.key[0]}({self.args[0]!r}, {self.args[1]!r})"

    __str__ = __repr__

    def value(self) -> ir.Value:
        """This size as an i64 in the function being emitted."""
        return current().value(self)


def _lo(x):
    return x.lo if isinstance(x, Size) else x


def _hi(x):
    return x.hi if isinstance(x, Size) else x


def upper(x) -> int:
    """The largest value of an int or Size."""
    return x.hi if isinstance(x, Size) else x


def lower(x) -> int:
    """The smallest value of an int or Size."""
    return x.lo if isinstance(x, Size) else x


def is_runtime(x) -> bool:
    return isinstance(x, Size)


# -- per-function materialisation --------------------------------------------------------------
@dataclass
class FnSizes:
    """The symbols of one LLVM function (kernel or parallel task) and the sizes computed
    from them, in its entry block."""
    fn: ir.Function
    dims: ir.Value | None            # i64* (None: a function without symbolic sizes)
    symbols: dict[str, int]          # symbol -> index into dims
    cache: dict = field(default_factory=dict)

    def _builder(self) -> ir.IRBuilder:
        # The entry block holds only set-up code and a branch to the body (see `body_block`),
        # so a size computed before that branch dominates every use.
        entry = self.fn.entry_basic_block
        b = ir.IRBuilder(entry)
        b.position_before(entry.terminator)
        return b

    def value(self, x) -> ir.Value:
        if isinstance(x, int):
            return ir.Constant(I64, x)
        if x.key in self.cache:
            return self.cache[x.key]
        if self.dims is None:
            raise SymbolicDecision(f"the runtime size {x} is used in a function without the symbols")
        if x.poly is not None:
            v = self._poly(x.poly)
        else:
            a, c = x.args
            av, cv = self.value(a), self.value(c)
            b = self._builder()
            kind, zero = x.key[0], ir.Constant(I64, 0)
            if kind == "add":
                v = b.add(av, cv)
            elif kind == "mul":
                v = b.mul(av, cv)
            elif kind == "div":  # floor division: -(-n // k) rounds up
                fix = b.and_(b.icmp_signed("!=", b.srem(av, cv), zero), b.icmp_signed("<", av, zero))
                v = b.sub(b.sdiv(av, cv), b.zext(fix, I64))
            elif kind == "mod":
                r = b.srem(av, cv)
                v = b.select(b.icmp_signed("<", r, zero), b.add(r, cv), r)
            elif kind == "min":
                v = b.select(b.icmp_signed("<", av, cv), av, cv)
            else:
                v = b.select(b.icmp_signed(">", av, cv), av, cv)
        self.cache[x.key] = v
        return v

    def _poly(self, text) -> ir.Value:
        total = None
        for key, coeff in sorted(symdim.parse(text).items()):
            vals = [self._symbol(s) for s in key]
            b = self._builder()
            term = ir.Constant(I64, coeff) if not vals else vals[0]
            for v in vals[1:]:
                term = b.mul(term, v)
            if vals and coeff != 1:
                term = b.mul(term, ir.Constant(I64, coeff))
            total = term if total is None else b.add(total, term)
        return total

    def _symbol(self, name: str) -> ir.Value:
        key = ("sym", name)
        if key not in self.cache:
            b = self._builder()
            idx = ir.Constant(I64, self.symbols[name])
            self.cache[key] = b.load(b.gep(self.dims, [idx], inbounds=True), name=f"sym.{name}")
        return self.cache[key]


def body_block(b: ir.IRBuilder) -> None:
    """End the function's entry block with a branch to a new `body` block and move the
    builder there: sizes materialise at the end of the entry block."""
    body = b.function.append_basic_block("body")
    b.branch(body)
    b.position_at_end(body)


_STACK: list[FnSizes] = []


def current() -> FnSizes:
    if not _STACK:
        raise SymbolicDecision("a runtime size is used outside a kernel")
    return _STACK[-1]


@contextlib.contextmanager
def emitting(sizes: FnSizes):
    """Sizes materialise in `sizes.fn` while the block runs."""
    _STACK.append(sizes)
    try:
        yield sizes
    finally:
        _STACK.pop()


# -- kernel-side tensor types ----------------------------------------------------------------
@dataclass(frozen=True)
class KType:
    """A tensor type as kernels see it: dims are ints or runtime Sizes."""
    shape: tuple
    dtype: str = "f32"
    layout: str = ""

    @staticmethod
    def of(t, bounds) -> "KType":
        return KType(tuple(Size.of(d, bounds) for d in t.shape), t.dtype, t.layout)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return not any(isinstance(d, Size) for d in self.shape)

    @property
    def numel(self):
        n = 1
        for d in self.shape:
            n = n * d
        return n

    @property
    def itemsize(self) -> int:
        from ...ir.types import DTYPES
        return DTYPES[self.dtype].itemsize

    @property
    def nbytes(self):
        return self.numel * self.itemsize

    def with_shape(self, shape) -> "KType":
        return KType(tuple(shape), self.dtype, self.layout)

    def __str__(self):
        return f"tensor<[{', '.join(str(d) for d in self.shape)}], {self.dtype}>"
