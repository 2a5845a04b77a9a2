"""Vector helpers for kernels: masked loads and stores, lane folds, in-register
transposes, integer min/max and index division, bf16 code pairs' halves.
"""
from __future__ import annotations

from llvmlite import ir

from .emit import F32, fconst, i64, store
from .loops import for_range


def pair_half(b, v, half: int):
    """The f32 value (scalar or vector) of one code of elements of plane pairs (32 bits
    each, as f32: two bf16 codes): half 0 the low code (plane 2i's), 1 the high one."""
    vec = isinstance(v.type, ir.VectorType)
    ity = ir.VectorType(ir.IntType(32), v.type.count) if vec else ir.IntType(32)

    def c(x):
        return ir.Constant(ity, [x] * v.type.count) if vec else ir.Constant(ity, x)
    bits = b.bitcast(v, ity)
    return b.bitcast(b.shl(bits, c(16)) if half == 0 else b.and_(bits, c(-65536)), v.type)


def pair_join(b, lo, hi):
    """pair_half's inverse for two f32 scalars holding bf16 values: the element of plane
    pairs whose low code is lo's, high code hi's."""
    i32 = ir.IntType(32)
    return b.bitcast(b.or_(b.bitcast(hi, i32), b.lshr(b.bitcast(lo, i32), ir.Constant(i32, 16))), F32)


def index_div(b, x, n):
    """x // n for an index x >= 0 (i64) and a count n > 0 (an int or a runtime size): a
    shift for a power of two, else an unsigned division (the signed one's fix-ups for a
    negative x cost a few instructions per use, which add up in the epilogues that find
    each row's bias and residual)."""
    if isinstance(n, int) and n & (n - 1) == 0:
        return b.lshr(x, i64(n.bit_length() - 1))
    return b.udiv(x, i64(n))


def index_rem(b, x, n):
    """x % n for an index x >= 0 (i64) and a count n > 0 (an int or a runtime size)."""
    if isinstance(n, int) and n & (n - 1) == 0:
        return b.and_(x, i64(n - 1))
    return b.urem(x, i64(n))


def zero_fill(b, ptr, start, count, dtype):
    with for_range(b, count, name="z") as j:
        store(b, fconst(dtype, 0.0), ptr, b.add(start, j), dtype)


def imin(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def imax(b, x, y):
    return b.select(b.icmp_signed(">", x, y), x, y)


def vector_transpose(b, rows):
    """The transpose of a square block held as len(rows) vectors of as many lanes: at
    each level h, the off-diagonal h x h blocks of every 2h x 2h block trade places."""
    n = len(rows)
    rows = list(rows)
    h = n // 2
    while h:
        for i in range(n):
            if i // h % 2:
                continue
            lo, hi = [], []
            for j in range(n):
                g, o = j // (2 * h) * 2 * h, j % (2 * h)
                lo.append(g + o if o < h else n + g + o - h)
                hi.append(g + h + o if o < h else n + g + o)
            a, c = rows[i], rows[i + h]
            mask = ir.IntType(32)
            rows[i] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(mask, n), lo))
            rows[i + h] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(mask, n), hi))
        h //= 2
    return rows


def strided_load(b, X, index, width: int, stride: int):
    """X[index + j * stride] for j < width as one vector: a plain load for stride 1,
    else a load of width * stride values and a shuffle that keeps every stride-th."""
    vty = ir.VectorType(F32, width * stride)
    wide = b.load(b.bitcast(b.gep(X, [index], inbounds=True), vty.as_pointer()), align=4)
    if stride == 1:
        return wide
    return b.shuffle_vector(wide, ir.Constant(vty, ir.Undefined),
                            ir.Constant(ir.VectorType(ir.IntType(32), width), [j * stride for j in range(width)]))


def masked_mem(b, name: str, vty, args):
    """Call llvm.masked.load / llvm.masked.store (the form with the alignment operand)."""
    full = f"llvm.masked.{name}.v{vty.count}f32.p0"
    fn = b.module.globals.get(full)
    if fn is None:
        ret = vty if name == "load" else ir.VoidType()
        fn = ir.Function(b.module, ir.FunctionType(ret, [a.type for a in args]), name=full)
    return b.call(fn, args)


def lane_mask(bits) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(1), len(bits)), [int(v) for v in bits])


def load_lanes(b, ptr, vty, valid):
    """The vector at ptr (a vty pointer), the lanes where `valid` is false read as 0
    and not touched in memory: a plain load where all are valid."""
    if all(valid):
        return b.load(ptr, align=4)
    return masked_mem(b, "load", vty, [ptr, ir.Constant(ir.IntType(32), 4), lane_mask(valid),
                                        ir.Constant(vty, [0.0] * vty.count)])


def store_lanes(b, v, ptr, count: int):
    """Store the first `count` lanes of v at ptr (a pointer to v's type)."""
    if count >= v.type.count:
        b.store(v, ptr, align=4)
    else:
        masked_mem(b, "store", v.type, [v, ptr, ir.Constant(ir.IntType(32), 4),
                                         lane_mask([j < count for j in range(v.type.count)])])


def fmax(b, a, v):
    """max for reductions: NaN propagates (as in torch); written as compare + select,
    a form LLVM's vectoriser handles without tripping over maxnum's cost model."""
    return b.select(b.fcmp_unordered(">", v, a), v, a)


def fmin(b, a, v):
    return b.select(b.fcmp_unordered("<", v, a), v, a)


def tree_fold(b, vals, op):
    """op-fold of vals (a list) as a balanced tree."""
    while len(vals) > 1:
        vals = [op(b, vals[i], vals[i + 1]) if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
    return vals[0]


def lanes_fold(b, v, op):
    """op-fold of the lanes of vector v, halving: a scalar."""
    width = v.type.count
    while width > 1:
        width //= 2
        halves = [b.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                      list(range(at, at + width)))) for at in (0, width)]
        v = op(b, halves[0], halves[1])
    return b.extract_element(v, ir.Constant(ir.IntType(32), 0))
