"""Outputs whose size depends on the data (nonzero, x[mask], masked_select): computed at
their upper bound plus the actual size, which the interpreter, `cuvil.compile`'s arrays
and the executables' outputs report. Compared exactly with torch (indices and selected
values are copies)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import cuvil
import cuvil.ir as cir
from cuvil.frontends.torch import capture_torch
from tests.ops.checks import Fn, seeded
from tests.targets.helpers import ALL, build_project, run


def check_cases(fn, cases):
    """Compile once at the first case; every case through torch, the interpreter and the
    native code, exactly (shapes included)."""
    model = Fn(fn).eval()
    module = capture_torch(model, cases[0])
    text = cir.print_module(module)
    assert cir.print_module(cir.parse_module(text, module.weights())) == text
    compiled = cuvil.compile(model, cases[0])
    for inputs in cases:
        with torch.no_grad():
            want = model(*inputs)
        want = [want] if isinstance(want, torch.Tensor) else list(want)
        arrays = [x.numpy() for x in inputs]
        for label, got in (("interpreter", cir.run(module, arrays)), ("native", compiled(*arrays))):
            got = [got] if isinstance(got, np.ndarray) else list(got)
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert np.shape(g) == tuple(w.shape), (label, np.shape(g), tuple(w.shape))
                np.testing.assert_array_equal(np.asarray(g), w.numpy(), err_msg=label)
    return module


def spread(seed, *shape, shift=0.0):
    return seeded(seed, *shape) + shift


@pytest.mark.parametrize("shape", [(), (1,), (9,), (3, 4), (2, 3, 5), (2, 1, 3, 2)], ids=str)
def test_nonzero_every_rank_from_none_to_all(shape):
    cases = [(spread(1, *shape),), (spread(2, *shape, shift=-10.0),), (spread(3, *shape, shift=10.0),),
             (spread(4, *shape, shift=0.5),)]
    module = check_cases(lambda x: torch.nonzero(x > 0), cases)
    bounds = module.main.attrs["dim_bounds"]
    assert list(bounds.values()) == [[0, int(np.prod(shape))]]


def test_nonzero_of_integers_and_argwhere():
    x = torch.tensor([[0, 3, 0, -1], [7, 0, 0, 0], [0, 0, 0, 2]])
    check_cases(lambda x: (torch.nonzero(x), torch.argwhere(x * 0 + 1)), [(x,), (x * 0,), (x + 100,)])


def test_boolean_mask_selects_elements_and_rows():
    def fn(x, y):
        return x[x > 0] * 2, y[y.sum(1) > 0], y[:, y[0] > 0]
    cases = [(spread(k, 3, 4), spread(k + 10, 5, 3)) for k in range(4)]
    cases.append((spread(20, 3, 4, shift=-9.0), spread(21, 5, 3, shift=-9.0)))
    check_cases(fn, cases)


def test_masked_select_broadcasts():
    check_cases(lambda x, m: torch.masked_select(x, m > 0), [(spread(k, 2, 3, 4), spread(k + 5, 3, 1)) for k in range(3)])


def test_ops_after_a_data_dependent_size():
    """Later kernels see the size the run produced: a sum, a softmax and a gather over
    the selected elements."""
    def fn(x, w):
        sel = x[x > 0.2]
        return sel.sum(), torch.softmax(sel, 0), w[torch.nonzero(x[0] > 0)[:, 0]]
    cases = [(spread(k, 4, 6), spread(k + 9, 6, 3)) for k in range(4)]
    cases.append((spread(30, 4, 6, shift=-8.0), spread(31, 6, 3)))
    for inputs in cases:  # sums compare at float32 rounding, the rest exactly
        inputs[0][0, 0] = 1.0
    model = Fn(fn).eval()
    compiled = cuvil.compile(model, cases[0])
    for inputs in cases:
        want = model(*inputs)
        got = compiled(*[x.numpy() for x in inputs])
        for g, w in zip(got, want):
            assert np.shape(g) == tuple(w.shape)
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)


NZ_PY = '''\
import torch


class Pick(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0.5)


def cuvil_entry():
    return Pick().eval(), (torch.zeros(4, 5),)
'''
NZ_YAML = '''\
model:
  framework: pytorch
  name: pick
  source: model.py
  entry: cuvil_entry
inputs:
  - {name: x, shape: [4, 5], dtype: f32}
outputs:
  - name: idx
'''


@pytest.mark.parametrize("target", ALL)
def test_nonzero_executable_writes_the_produced_size(target, tmp_path):
    exe = build_project(tmp_path, NZ_PY, NZ_YAML, target, "pick")
    rng = np.random.default_rng(0)
    for k, shift in enumerate((0.0, -5.0, 5.0)):
        x = (rng.standard_normal((4, 5)) + shift).astype(np.float32)
        np.save(tmp_path / f"x{k}.npy", x)
        run(exe, "--input", tmp_path / f"x{k}.npy", "--output", tmp_path / f"y{k}.npy")
        run(exe, "--input", tmp_path / f"x{k}.npy", "--output", tmp_path / f"y{k}.json")
        want = np.argwhere(x > 0.5)
        got = np.load(tmp_path / f"y{k}.npy")
        assert got.dtype == np.int64 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        out = json.loads((tmp_path / f"y{k}.json").read_text())["outputs"][0]
        assert out["shape"] == list(want.shape)
        np.testing.assert_array_equal(np.asarray(out["data"], np.int64).reshape(want.shape), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32, torch.uint8])
def test_unique_sorted_with_inverse_and_counts(dtype):
    def fn(x):
        values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
        return values, inverse, counts, torch.unique(x * 2)
    gen = torch.Generator().manual_seed(0)
    cases = [(torch.randint(0, 6, (3, 5), generator=gen).to(dtype),) for _ in range(3)]
    cases += [(torch.full((3, 5), 4).to(dtype),), (torch.arange(15).reshape(3, 5).flip(1).to(dtype),)]
    if dtype.is_floating_point:
        cases += [(torch.tensor([[-0.5, 2.5, -0.5, 1e-3, 7.0], [3.0, -2.0, 2.5, 0.0, -0.0],
                                 [1e9, -1e9, 3.0, 3.0, 3.0]]),)]
    check_cases(fn, cases)


@pytest.mark.parametrize("shape", [(), (1,), (40,), (2, 3, 4)], ids=str)
def test_unique_values_alone_every_rank(shape):
    gen = torch.Generator().manual_seed(1)
    check_cases(lambda x: torch.unique(x), [(torch.randint(-3, 3, shape, generator=gen),) for _ in range(3)])


BRANCH_UNIQUE_PY = '''\
import torch


class BranchUnique(torch.nn.Module):
    """A branch taken by the data, and the distinct row counts of positive entries."""

    def forward(self, x):
        y = torch.cond(x.sum() > 0, lambda x: x * 2.0 + 1.0, lambda x: x.abs() - 3.0, (x,))
        values, counts = torch.unique((x > 0).sum(1), return_counts=True)
        return y, values, counts


def cuvil_entry():
    return BranchUnique().eval(), (torch.zeros(6, 5),)
'''
BRANCH_UNIQUE_YAML = '''\
model:
  framework: pytorch
  name: branch_unique
  source: model.py
  entry: cuvil_entry
inputs:
  - {name: x, shape: [6, 5], dtype: f32}
outputs:
  - name: y
  - name: values
  - name: counts
'''


@pytest.mark.parametrize("target", ALL)
def test_cond_and_unique_executable(target, tmp_path):
    exe = build_project(tmp_path, BRANCH_UNIQUE_PY, BRANCH_UNIQUE_YAML, target, "bu")
    rng = np.random.default_rng(5)
    for k, shift in enumerate((1.0, -1.0, 0.2, 6.0)):
        x = (rng.standard_normal((6, 5)) + shift).astype(np.float32)
        np.save(tmp_path / f"x{k}.npy", x)
        run(exe, "--input", tmp_path / f"x{k}.npy", "--output", tmp_path / f"o{k}.json")
        outs = {o["name"]: o for o in json.loads((tmp_path / f"o{k}.json").read_text())["outputs"]}
        y = x * 2 + 1 if x.sum() > 0 else np.abs(x) - 3
        values, counts = np.unique((x > 0).sum(1), return_counts=True)
        np.testing.assert_allclose(np.asarray(outs["y"]["data"], np.float32).reshape(6, 5), y, rtol=0, atol=1e-6)
        assert outs["values"]["shape"] == [len(values)] and outs["counts"]["shape"] == [len(values)]
        assert outs["values"]["data"] == values.tolist() and outs["counts"]["data"] == counts.tolist()


def test_a_produced_size_used_as_a_number():
    """x.shape[0] of a data-dependent result in arithmetic: the op stays for its size
    even when nothing reads its values, and the count is read at run time."""
    check_cases(lambda x, m: x * torch.nonzero(m > 0).shape[0] + 1.0,
                [(spread(1, 3).round(), spread(k, 4, 5)) for k in (2, 3)] + [(spread(1, 3).round(), spread(4, 4, 5, shift=-9.0))])
    model = Fn(lambda x, m: x[m > 0].sum() / torch.nonzero(m > 0).shape[0]).eval()
    cases = [(spread(k, 4, 5), spread(k + 1, 4, 5)) for k in range(3)]
    compiled = cuvil.compile(model, cases[0])
    for x, m in cases:
        np.testing.assert_allclose(compiled(x.numpy(), m.numpy())[0], model(x, m).numpy(), rtol=1e-6)
