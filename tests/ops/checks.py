"""The one check every op test uses: run a model in torch eager and in Cuvil, compare.

    check_torch(lambda x, y: x + y, x, y, atol=1e-6, rtol=1e-6)

Cuvil's side is the captured IR run by the NumPy interpreter (the ops' references)
and, once the native backend exists, the compiled model as well. Each is compared with
torch for the number of outputs, their shapes, dtypes and values (`atol`/`rtol`; exact
for integer and bool outputs).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

import cuvil
import cuvil.ir as cir
from cuvil.frontends.torch import capture_torch


class Fn(nn.Module):
    """Wraps a plain function so torch.export sees a module."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _flatten(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for item in out for t in _flatten(item)]
    raise TypeError(f"model output {type(out).__name__} is not a tensor or a sequence of tensors")


def _compare(label: str, expected: Sequence[torch.Tensor], got: Sequence[np.ndarray],
             atol: float, rtol: float) -> None:
    assert len(got) == len(expected), f"{label}: {len(got)} outputs, torch gives {len(expected)}"
    for i, (want, have) in enumerate(zip(expected, got)):
        want = want.detach().numpy()
        have = np.asarray(have)
        where = f"{label}, output {i}"
        assert have.shape == want.shape, f"{where}: shape {have.shape}, torch gives {want.shape}"
        assert have.dtype == want.dtype, f"{where}: dtype {have.dtype}, torch gives {want.dtype}"
        if want.dtype.kind in "biu":
            np.testing.assert_array_equal(have, want, err_msg=where)
        else:
            np.testing.assert_allclose(have, want, atol=atol, rtol=rtol, equal_nan=True, err_msg=where)


def check_torch(fn_or_module, *inputs: torch.Tensor, atol: float, rtol: float,
                name: str | None = None) -> cir.Module:
    """Compare Cuvil with torch eager on `inputs`; returns the captured IR module so a
    test can also assert what the op lowered to."""
    module = fn_or_module if isinstance(fn_or_module, nn.Module) else Fn(fn_or_module)
    module.eval()
    label = name or getattr(fn_or_module, "__name__", type(module).__name__)
    arrays = [x.detach().numpy().copy() for x in inputs]  # before torch runs: in-place ops
    with torch.no_grad():
        expected = _flatten(module(*(x.clone() for x in inputs)))

    # -- Cuvil IR, run by the NumPy interpreter -------------------------------------------
    ir_module = capture_torch(module, inputs)
    text = cir.print_module(ir_module)
    assert cir.print_module(cir.parse_module(text, ir_module.weights())) == text, \
        f"{label}: IR text does not round-trip"
    _compare(f"{label} (interpreter)", expected, cir.run(ir_module, arrays), atol, rtol)

    # -- native code from the backend --------------------------------------------------
    # Runs as soon as the backend exposes `cuvil.compile`; make it unconditional then.
    if hasattr(cuvil, "compile"):
        compiled = cuvil.compile(module, inputs)
        _compare(f"{label} (native)", expected, compiled(*arrays), atol, rtol)

    return ir_module


def seeded(seed: int, *shape: int, dtype=torch.float32, low: float | None = None,
           high: float | None = None) -> torch.Tensor:
    """A seeded tensor: standard normal, or uniform in [low, high) when both are given."""
    gen = torch.Generator().manual_seed(seed)
    if low is not None and high is not None:
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low).to(dtype)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def op_names(ir_module: cir.Module) -> list[str]:
    """The op names of `main`, in order (constants and the terminator left out)."""
    return [op.name for op in ir_module.main.body.ops if op.name not in ("cuvil.constant", "cuvil.return")]


def run_guarded(compiled, *arrays: np.ndarray, guard: int = 64) -> tuple[np.ndarray, ...]:
    """Run a compiled model with each output written into a buffer followed by `guard`
    NaN sentinels, and assert no kernel stored past the end of an output."""
    import ctypes
    ins = [np.ascontiguousarray(a, t.np_dtype) for a, (_, t) in zip(arrays, compiled.inputs)]
    bufs = [np.full(int(np.prod(t.shape)) + guard, np.nan, t.np_dtype) for _, t in compiled.outputs]
    in_ptrs = (ctypes.c_void_p * len(ins))(*[a.ctypes.data for a in ins])
    out_ptrs = (ctypes.c_void_p * len(bufs))(*[o.ctypes.data for o in bufs])
    compiled._invoke(in_ptrs, out_ptrs)
    for buf in bufs:
        assert np.isnan(buf[-guard:]).all(), "a kernel wrote past the end of its output"
    return tuple(buf[:-guard].reshape(t.shape) for buf, (_, t) in zip(bufs, compiled.outputs))
