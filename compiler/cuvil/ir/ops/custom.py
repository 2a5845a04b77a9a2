"""`cuvil.custom`: an op the compiler cannot lower, bound to a named C function.

    %2 = cuvil.custom(%0, %1) {dtype = "f32", params = [0.1], shape = [1, 64], symbol = "fancy_act"} : f32[1, 64]

The backend calls `symbol` with the operands and the result as `cuvil_op_tensor`s
and the `params` (scalars) as doubles (see cuvil_plugin.h); a plugin module linked
at the link stage defines it. The result's shape and dtype are attributes, because
nothing in the compiler knows what the function computes.

The interpreter has no C to call: a NumPy reference can be registered for a symbol
(`CUSTOM_REFERENCES[symbol] = fn(args, params) -> array`), which tests and constant
folding use; without one, evaluating the op is an error (and folding leaves it be).
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np

from ...errors import CuvilError, VerifyError
from ..core import Op
from ..types import DTYPES, TensorType

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# symbol -> NumPy reference (args, params) -> result
CUSTOM_REFERENCES: dict[str, Callable[[list[np.ndarray], list[float]], np.ndarray]] = {}


class Custom(Op):
    name = "cuvil.custom"

    @classmethod
    def infer_types(cls, types, attrs):
        symbol = attrs.get("symbol")
        if not isinstance(symbol, str) or not _SYMBOL.match(symbol):
            raise VerifyError(f"cuvil.custom: symbol must be a C identifier, got {symbol!r}")
        shape, dtype = attrs.get("shape"), attrs.get("dtype")
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise VerifyError(f"cuvil.custom {symbol}: shape must be a list of non-negative ints, got {shape!r}")
        if dtype not in DTYPES:
            raise VerifyError(f"cuvil.custom {symbol}: unknown dtype {dtype!r}")
        params = attrs.get("params", [])
        if not isinstance(params, (list, tuple)) or not all(isinstance(p, (int, float)) for p in params):
            raise VerifyError(f"cuvil.custom {symbol}: params must be a list of numbers, got {params!r}")
        return [TensorType(tuple(shape), dtype)]

    @classmethod
    def reference(cls, args, attrs):
        fn = CUSTOM_REFERENCES.get(attrs["symbol"])
        if fn is None:
            raise CuvilError(f"cuvil.custom {attrs['symbol']}: a C function; the interpreter has no NumPy "
                             "reference for it (register one in cuvil.ir.ops.custom.CUSTOM_REFERENCES)")
        return [fn(list(args), [float(p) for p in attrs.get("params", [])])]
