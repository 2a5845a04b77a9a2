"""The harness itself: check_torch must fail when Cuvil's answer is wrong in value,
shape, dtype or output count (otherwise every op test could pass vacuously)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuvil.ir
from cuvil.frontends import torch_ops
from tests.ops.checks import check_torch, seeded

X = seeded(1, 3, 4)


def test_passes_on_a_correct_lowering():
    ir = check_torch(torch.relu, X, atol=0, rtol=0)
    assert [op.name for op in ir.main.body.ops] == ["cuvil.relu", "cuvil.return"]


def test_fails_on_a_wrong_lowering(monkeypatch):
    monkeypatch.setitem(torch_ops.HANDLERS, "aten::relu", lambda low, a: low.op("cuvil.sigmoid", a["self"]))
    with pytest.raises(AssertionError, match="interpreter"):
        check_torch(torch.relu, X, atol=1e-3, rtol=1e-3)


def test_tolerance_is_applied(monkeypatch):
    run = cuvil.ir.run
    monkeypatch.setattr(cuvil.ir, "run", lambda m, xs: tuple(y + np.float32(1e-3) for y in run(m, xs)))
    check_torch(torch.relu, X, atol=2e-3, rtol=0)
    with pytest.raises(AssertionError):
        check_torch(torch.relu, X, atol=1e-4, rtol=0)


@pytest.mark.parametrize("wrong, message", [
    (lambda y: (y.reshape(4, 3),), "shape"),
    (lambda y: (y.astype(np.float64),), "dtype"),
    (lambda y: (y, y), "outputs"),
])
def test_fails_on_wrong_shape_dtype_or_count(monkeypatch, wrong, message):
    run = cuvil.ir.run
    monkeypatch.setattr(cuvil.ir, "run", lambda m, xs: wrong(run(m, xs)[0]))
    with pytest.raises(AssertionError, match=message):
        check_torch(torch.relu, X, atol=1, rtol=1)


def test_integer_outputs_compare_exactly(monkeypatch):
    run = cuvil.ir.run
    monkeypatch.setattr(cuvil.ir, "run", lambda m, xs: tuple(y + 1 for y in run(m, xs)))
    with pytest.raises(AssertionError):
        check_torch(lambda x: x * 2, torch.arange(6), atol=10, rtol=10)


def test_inputs_are_not_mutated_by_inplace_models():
    x = X.clone()
    check_torch(lambda x: x.relu_(), x, atol=0, rtol=0)
    assert torch.equal(x, X)
