"""torch.einsum as transposes, reshapes and batched matmuls. Registered into the same
HANDLERS table as torch_ops.

Each operand first takes its diagonals (a letter repeated in one operand) and sums the
letters no other operand or the output has; then operands are contracted left to right,
each pair as one matmul [batch, left, contracted] @ [batch, contracted, right]; the
result is transposed to the output's order. '...' stands for the broadcast dims
(aligned from the right), size-1 dims broadcast against the other operands.
"""
from __future__ import annotations

from math import prod

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Value
from .torch_ops import handles

_SPARE = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    specs = lhs.split(",")
    if len(specs) != len(ranks):
        raise UnsupportedOpError(f"einsum {equation!r}: {len(specs)} operand specs for {len(ranks)} tensors")
    used = set(eq) - set(".,->")
    spare = [c for c in _SPARE if c not in used]
    n_ell = max((r - (len(s) - 3) for s, r in zip(specs, ranks) if "..." in s), default=0)
    ell = "".join(spare[:n_ell])
    specs = [s.replace("...", ell[n_ell - (r - (len(s) - 3)):]) if "..." in s else s for s, r in zip(specs, ranks)]
    if "->" in eq:
        out = rhs.replace("...", ell)
    else:  # implicit output: the broadcast dims, then every letter used once, alphabetically
        counts = {c: sum(s.count(c) for s in specs) for c in used}
        out = ell + "".join(sorted(c for c in used if counts[c] == 1))
    return specs, out


def _transpose(low, x: Value, letters: str, order: str) -> Value:
    if letters == order:
        return x
    return low.op("cuvil.transpose", x, perm=[letters.index(c) for c in order])


def _sum(low, x: Value, letters: str, drop: set) -> tuple[Value, str]:
    axes = [i for i, c in enumerate(letters) if c in drop]
    if not axes:
        return x, letters
    return (low.op("cuvil.reduce_sum", x, axes=axes, keepdims=False),
            "".join(c for c in letters if c not in drop))


def _diagonals(low, x: Value, letters: str) -> tuple[Value, str]:
    """x along its repeated letters' diagonals: where(eye, x, 0) summed over the repeat."""
    while len(set(letters)) < len(letters):
        c = next(c for c in letters if letters.count(c) > 1)
        p, q = letters.index(c), letters.index(c, letters.index(c) + 1)
        n = int(x.shape[p])
        shape = [1] * len(letters)
        shape[p] = shape[q] = n
        eye = low.const(np.eye(n, dtype=bool).reshape(shape))
        x = low.op("cuvil.reduce_sum", low.op("cuvil.where", eye, x, low.const(np.zeros(()), x.dtype)),
                   axes=[q], keepdims=False)
        letters = letters[:q] + letters[q + 1:]
    return x, letters


def _pair(low, a: Value, la: str, b: Value, lb: str, keep: set, sizes: dict) -> tuple[Value, str]:
    batch = [c for c in la if c in lb and c in keep]
    contr = [c for c in la if c in lb and c not in keep]
    left = [c for c in la if c not in lb]
    right = [c for c in lb if c not in la]
    size = lambda cs: prod(sizes[c] for c in cs)  # noqa: E731
    a = _transpose(low, a, la, "".join(batch + left + contr))
    b = _transpose(low, b, lb, "".join(batch + contr + right))
    a = low.reshape(a, [size(batch), size(left), size(contr)])
    b = low.reshape(b, [size(batch), size(contr), size(right)])
    y = low.op("cuvil.matmul", a, b)
    letters = "".join(batch + left + right)
    return low.reshape(y, [sizes[c] for c in letters]), letters


@handles("einsum")
def _einsum(low, a):
    ops = list(a["tensors"])
    specs, out = _parse(a["equation"], [t.type.rank for t in ops])
    dtype = low.meta_type().dtype
    sizes: dict = {}
    for t, s in zip(ops, specs):
        for c, d in zip(s, t.shape):
            if not isinstance(d, int):
                raise UnsupportedOpError(f"einsum over the symbolic dim {d} is not supported")
            sizes[c] = max(sizes.get(c, 1), int(d))
    terms = []
    for i, (t, s) in enumerate(zip(ops, specs)):
        t = low.cast(t, dtype)
        full = [sizes[c] for c in s]
        if list(t.shape) != full:
            t = low.op("cuvil.broadcast_to", t, shape=full)
        t, s = _diagonals(low, t, s)
        others = set(out).union(*[set(o) for j, o in enumerate(specs) if j != i])
        terms.append(_sum(low, t, s, set(s) - others))
    x, lx = terms[0]
    for k in range(1, len(terms)):
        keep = set(out).union(*[set(terms[j][1]) for j in range(k + 1, len(terms))])
        x, lx = _pair(low, x, lx, *terms[k], keep, sizes)
        x, lx = _sum(low, x, lx, set(lx) - keep)
    x, lx = _sum(low, x, lx, set(lx) - set(out))
    return _transpose(low, x, lx, out)
