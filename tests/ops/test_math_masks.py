"""sin/cos, triu/tril and torch.min/max(a, b) against torch float32, through the NumPy
interpreter and `cuvil.compile` on the host (check_torch), plus a sin/cos executable
built and run for aarch64 (qemu) and wasm32 (Node).

Tolerances: sin and cos reduce the argument in float64 (exact for |x| < 1.6e6) and
evaluate Taylor polynomials in float32, measured within 7e-8 of float64 sin/cos; torch's
float32 result is within half an ulp of 1.0 (6e-8) of it, so the two differ by at most
~1.3e-7 in absolute terms at any magnitude of x. ATOL_TRIG = 2.5e-7 (two ulp of 1.0)
leaves room for the last rounding of either side; relative tolerance would be wrong near
the zeros of sin/cos. triu/tril and min/max select values and are compared exactly.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cuvil.frontends.torch import capture_torch
from cuvil.passes import run_pipeline
from tests.ops.checks import Fn, check_torch, op_names, seeded

ATOL_TRIG = 2.5e-7
SHAPES = [(), (7,), (5, 9), (2, 3, 17), (2, 3, 4, 5)]
NONFINITE = [float("inf"), float("-inf"), float("nan"), 0.0, -0.0]


def spread(seed: int, shape, limit: float) -> torch.Tensor:
    return seeded(seed, *shape, low=-limit, high=limit)


# -- sin / cos ---------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [torch.sin, torch.cos], ids=["sin", "cos"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_trig_shapes(fn, shape):
    check_torch(fn, spread(1, shape, 10.0), atol=ATOL_TRIG, rtol=0)


@pytest.mark.parametrize("fn", [torch.sin, torch.cos], ids=["sin", "cos"])
@pytest.mark.parametrize("limit", [1.0, 100.0, 1e4])
def test_trig_several_periods(fn, limit):
    """|x| up to 1e4 (1600 periods): the error stays at the float32 rounding of the result."""
    check_torch(fn, spread(2, (4, 1000), limit), atol=ATOL_TRIG, rtol=0)


@pytest.mark.parametrize("fn", [torch.sin, torch.cos], ids=["sin", "cos"])
def test_trig_special_values(fn):
    """inf and NaN give NaN; sin(-0) = -0; multiples of pi/2 land on the right quadrant."""
    x = torch.tensor(NONFINITE + [k * float(np.pi / 2) for k in range(-8, 9)] + [1e-30, -3e-39])
    check_torch(fn, x, atol=ATOL_TRIG, rtol=0)
    if fn is torch.sin:
        module = check_torch(fn, torch.tensor([-0.0]), atol=0, rtol=0)
        assert op_names(module) == ["cuvil.sin"]


def test_trig_non_contiguous_and_methods():
    check_torch(lambda x: x.transpose(0, 1).sin() + x.t().cos(), spread(3, (6, 5), 8.0), atol=2 * ATOL_TRIG, rtol=0)
    check_torch(lambda x: torch.sin(x[:, ::2]), spread(4, (3, 10), 8.0), atol=ATOL_TRIG, rtol=0)


def _fused_programs(fn, *inputs):
    module = capture_torch(Fn(fn), inputs)
    run_pipeline(module)
    return [[ins[0] for ins in op.attrs["program"]] for op in module.main.body.ops if op.name == "cuvil.fused"]


def test_trig_fuses_with_neighbours():
    def fn(x, y):
        return x * torch.sin(y) + torch.cos(x) * 0.5 + 1.0
    x, y = spread(5, (3, 8), 20.0), spread(6, (3, 8), 20.0)
    check_torch(fn, x, y, atol=2 * ATOL_TRIG, rtol=1e-6)
    programs = _fused_programs(fn, x, y)
    assert len(programs) == 1 and {"sin", "cos", "mul", "add"} <= set(programs[0]), programs
    # a sin of a broadcast operand stays its own loop (computed once per element of y),
    # as FuseElementwise does for every unary op; the rest still fuses
    y = spread(6, (8,), 20.0)
    check_torch(fn, x, y, atol=2 * ATOL_TRIG, rtol=1e-6)
    assert _fused_programs(fn, x, y) == [["sin"], ["mul", "cos", "mul", "add", "add"]]


def test_trig_unfused_alone():
    module = check_torch(torch.cos, spread(7, (2, 33), 50.0), atol=ATOL_TRIG, rtol=0)
    assert op_names(module) == ["cuvil.cos"]


# -- triu / tril -------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["triu", "tril"])
@pytest.mark.parametrize("diagonal", [-3, -1, 0, 1, 2, 7])
@pytest.mark.parametrize("shape", [(4, 4), (3, 6), (6, 3), (2, 4, 5), (2, 3, 4, 5), (1, 1)], ids=str)
def test_triangle(which, diagonal, shape):
    fn = getattr(torch, which)
    module = check_torch(lambda x: fn(x, diagonal=diagonal), seeded(8, *shape), atol=0, rtol=0)
    assert "cuvil.where" in op_names(module)


@pytest.mark.parametrize("which", ["triu", "tril"])
def test_triangle_keeps_inf_and_nan(which):
    """Kept inf/NaN stay; masked ones become 0 (a 0/1 mask product would give NaN)."""
    x = torch.tensor([[np.inf, np.nan, -np.inf], [np.nan, 1.0, np.inf], [-np.inf, np.nan, 2.0]])
    check_torch(lambda t: getattr(torch, which)(t, 1 if which == "triu" else -1), x, atol=0, rtol=0)
    check_torch(getattr(torch, which), x, atol=0, rtol=0)


def test_triangle_methods_fused_and_non_contiguous():
    check_torch(lambda x: x.t().triu(1) * 2.0 + 1.0, seeded(9, 5, 7), atol=1e-6, rtol=1e-6)
    check_torch(lambda x: torch.tril(x.expand(3, 4, 4), -1), seeded(10, 1, 4, 4), atol=0, rtol=0)
    check_torch(lambda x: (x * 1.0).triu_(-1), seeded(10, 3, 5), atol=0, rtol=0)
    # the causal-mask pattern of HF models: a triu of a constant fill
    check_torch(lambda x: x + torch.triu(torch.full((6, 6), float("-inf")), 1), seeded(11, 2, 6, 6),
                atol=0, rtol=0)


def test_triangle_integer_and_bool():
    ints = torch.arange(20, dtype=torch.int64).reshape(4, 5)
    check_torch(lambda x: torch.triu(x, -1), ints, atol=0, rtol=0)
    check_torch(lambda x: torch.tril(x > 7), ints, atol=0, rtol=0)


# -- torch.min / torch.max of two tensors -----------------------------------------------
@pytest.mark.parametrize("fn", [torch.min, torch.max], ids=["min", "max"])
@pytest.mark.parametrize("shapes", [((), ()), ((7,), (7,)), ((5, 9), (9,)), ((2, 3, 17), (3, 1)),
                                    ((2, 3, 4, 5), (1, 3, 1, 5)), ((4,), ())], ids=str)
def test_min_max_other(fn, shapes):
    a, b = shapes
    module = check_torch(fn, seeded(12, *a), seeded(13, *b), atol=0, rtol=0)
    assert op_names(module) == [f"cuvil.{fn.__name__}imum"]


@pytest.mark.parametrize("fn", [torch.min, torch.max], ids=["min", "max"])
def test_min_max_other_inf_nan(fn):
    """NaN in either operand gives NaN (torch.minimum's rule); inf compares as usual."""
    a = torch.tensor([np.nan, 1.0, np.inf, -np.inf, np.nan, 0.0, -0.5])
    b = torch.tensor([2.0, np.nan, 3.0, 4.0, np.nan, np.inf, -np.inf])
    check_torch(fn, a, b, atol=0, rtol=0)
    check_torch(lambda x, y: fn(x.t(), y) * 2.0, seeded(14, 4, 3), seeded(15, 3, 4), atol=0, rtol=0)


def test_min_max_reductions():
    """torch.max/min along a dim (values and indices) and of a whole tensor."""
    check_torch(lambda x: torch.max(x, 1), seeded(16, 3, 4), atol=0, rtol=0)
    check_torch(lambda x: torch.min(x, 0, keepdim=True), seeded(16, 3, 4), atol=0, rtol=0)
    check_torch(lambda x: torch.max(x) - torch.min(x), seeded(16, 3, 4), atol=0, rtol=0)


def test_min_max_other_integer():
    a = torch.arange(-6, 6, dtype=torch.int64).reshape(3, 4)
    check_torch(lambda x, y: torch.max(x, y) - torch.min(x, y), a, a.flip(0), atol=0, rtol=0)


# -- cross targets -----------------------------------------------------------------------
TRIG_PY = '''\
import torch
from torch import nn


class Trig(nn.Module):
    def forward(self, x):
        return torch.sin(x) * 2.0 + torch.cos(x)


def cuvil_entry():
    return Trig().eval(), (torch.zeros(4, 250),)
'''
TRIG_YAML = '''\
model:
  framework: pytorch
  name: trig
  source: model.py
  entry: cuvil_entry
inputs:
  - name: x
    shape: [4, 250]
    dtype: f32
outputs:
  - name: y
'''


@pytest.mark.parametrize("target", ["aarch64-linux-gnu", "wasm32-wasi"])
def test_trig_on_cross_targets(target, tmp_path):
    from cuvil.build import build
    from cuvil.config import load_config
    from tests.targets.helpers import available, run_npy
    if not available(target):
        pytest.skip(f"{target} toolchain or runner missing")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "model.py").write_text(TRIG_PY)
    (tmp_path / "p" / "config.yaml").write_text(TRIG_YAML)
    exe = build(load_config(tmp_path / "p" / "config.yaml", target=target), tmp_path / "trig",
                cache_dir=tmp_path / "cache", log=lambda s: None)
    x = np.random.default_rng(3).uniform(-1e4, 1e4, (4, 250)).astype(np.float32)
    got = run_npy(exe, [x], tmp_path)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got, np.sin(x64) * 2.0 + np.cos(x64), atol=4 * ATOL_TRIG, rtol=0)
