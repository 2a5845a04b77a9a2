"""torch.cond and torch while_loop through Cuvil: the interpreter and `cuvil.compile`
against torch eager on inputs that take every branch and many trip counts, a greedy
decoder with a KV cache whose tokens must equal the Python loop's, and `cuvil build`
executables of the decoder on the host, aarch64 (qemu) and wasm32 (Node).

Tolerances: the branch and loop models are float32 chains of a few linear layers;
ATOL 2e-6 covers the summation-order differences of their matmuls after up to ~20 loop
trips. Trip counts, token ids and counts are integers and compared exactly."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import cuvil
import cuvil.ir as cir
from cuvil.frontends.torch import capture_torch
from tests.control.models import Branchy, Halving, decoder, decoder_inputs
from tests.targets.helpers import ALL, ROOT, build_project, run

ATOL = 2e-6


def _np(t):
    return t.detach().numpy()


def check_many(model, example, cases, atol=ATOL):
    """Capture and compile once, then run every case through torch, the interpreter
    and the native code."""
    module = capture_torch(model, example)
    text = cir.print_module(module)
    assert cir.print_module(cir.parse_module(text, module.weights())) == text
    compiled = cuvil.compile(model, example)
    for inputs in cases:
        with torch.no_grad():
            want = model(*inputs)
        want = [want] if isinstance(want, torch.Tensor) else list(want)
        arrays = [_np(x) for x in inputs]
        interp = cir.run(module, arrays)
        native = compiled(*arrays)
        native = [native] if isinstance(native, np.ndarray) else list(native)
        for got in (interp, native):
            assert len(got) == len(want)
            for g, w in zip(got, want):
                g = np.asarray(g)
                assert g.shape == tuple(w.shape) and g.dtype == _np(w).dtype
                np.testing.assert_allclose(g, _np(w), atol=atol, rtol=0)
    return module


def test_cond_takes_both_branches():
    torch.manual_seed(0)
    model = Branchy().eval()
    xs = [torch.randn(3, 8, generator=torch.Generator().manual_seed(s)) for s in range(6)]
    xs += [x.abs() for x in xs[:2]] + [-x.abs() for x in xs[:2]]
    taken = {bool(x.sum() > 0) for x in xs}
    assert taken == {True, False}
    module = check_many(model, (xs[0],), [(x,) for x in xs])
    assert [op.name for op in module.main.body.ops if op.regions] == ["cuvil.if"]


def test_cond_with_a_bool_input_and_several_outputs():
    def fn(p, x, y):
        return torch.cond(p, lambda x, y: (x + y, x * y), lambda x, y: (x - y, torch.relu(y)), (x, y))

    class F(torch.nn.Module):
        def forward(self, p, x, y):
            return fn(p, x, y)
    x, y = torch.randn(2, 5), torch.randn(2, 5)
    check_many(F(), (torch.tensor(True), x, y), [(torch.tensor(p), x, y) for p in (True, False, True)])


def test_while_loop_with_a_data_dependent_trip_count():
    torch.manual_seed(1)
    model = Halving().eval()
    scales = [0.1, 2.0, 10.0, 100.0, 1e4]
    cases = [(torch.randn(2, 8, generator=torch.Generator().manual_seed(i)) * s,) for i, s in enumerate(scales)]
    trips = [int(model(*c)[0]) for c in cases]
    assert trips[0] == 0 and len(set(trips)) >= 4, trips  # from no trip at all to many
    check_many(model, cases[2], cases)


def test_while_loop_limit_is_an_input():
    from torch._higher_order_ops.while_loop import while_loop

    class Power(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 6)

        def forward(self, n, y):
            return while_loop(lambda i, y: i < n, lambda i, y: (i + 1, torch.tanh(self.lin(y))),
                              (torch.zeros((), dtype=torch.int64), y))
    torch.manual_seed(2)
    model, y = Power().eval(), torch.randn(4, 6)
    check_many(model, (torch.tensor(3), y), [(torch.tensor(n), y) for n in (0, 1, 3, 8, 20, -1)])


# -- a greedy decoder with a KV cache ---------------------------------------------------------
PROMPTS = [([3, 4, 5], 10), ([7], 30), ([2, 9, 11, 5, 6], 4), ([5, 5], 0), ([12, 1, 3], 22), ([8], 1)]


@pytest.fixture(scope="module")
def tiny_decoder():
    model = decoder(0)
    return model, cuvil.compile(model, decoder_inputs(model, *PROMPTS[0]))


def test_decoder_reference_is_the_python_loop(tiny_decoder):
    """The while_loop model in eager mode decodes as the plain Python loop does, and the
    cases cover stopping on the end token, on the limit and at once."""
    model, _ = tiny_decoder
    ends = set()
    for prompt, limit in PROMPTS:
        with torch.no_grad():
            out, n = model(*decoder_inputs(model, prompt, limit))
        new = model.generate(prompt, limit)
        assert out[:int(n)].tolist() == new
        ends.add("end" if new and new[-1] == model.end else "limit" if len(new) == limit else "other")
    assert {"end", "limit"} <= ends


@pytest.mark.parametrize("prompt, limit", PROMPTS)
def test_decoder_tokens_equal_torch(tiny_decoder, prompt, limit):
    model, compiled = tiny_decoder
    out, n = compiled(*[_np(t) for t in decoder_inputs(model, prompt, limit)])
    assert out[:int(n)].tolist() == model.generate(prompt, limit)
    assert (out[int(n):] == -1).all()


def test_decoder_interpreter_agrees():
    model = decoder(0)
    module = capture_torch(model, decoder_inputs(model, *PROMPTS[0]))
    for prompt, limit in PROMPTS[:3]:
        out, n = cir.run(module, [_np(t) for t in decoder_inputs(model, prompt, limit)])
        assert out[:int(n)].tolist() == model.generate(prompt, limit)


DECODER_PY = '''\
from tests.control.models import decoder, decoder_inputs


def cuvil_entry():
    model = decoder(0)
    return model, decoder_inputs(model, [3, 4, 5], 10)
'''
DECODER_YAML = '''\
model:
  framework: pytorch
  name: decoder
  source: model.py
  entry: cuvil_entry
inputs:
  - {name: prompt, shape: [24], dtype: i64}
  - {name: length, shape: [], dtype: i64}
  - {name: limit, shape: [], dtype: i64}
outputs:
  - name: tokens
  - name: count
'''


@pytest.mark.parametrize("target", ALL)
def test_decoder_executable(target, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    exe = build_project(tmp_path, DECODER_PY, DECODER_YAML, target, "decoder")
    model = decoder(0)
    for k, (prompt, limit) in enumerate(PROMPTS[:4]):
        args = []
        for name, t in zip(("prompt", "length", "limit"), decoder_inputs(model, prompt, limit)):
            np.save(tmp_path / f"{name}{k}.npy", _np(t))
            args += ["--input", f"{name}={tmp_path / f'{name}{k}.npy'}"]
        run(exe, *args, "--output", tmp_path / f"out{k}.json")
        outs = {o["name"]: o["data"] for o in json.loads((tmp_path / f"out{k}.json").read_text())["outputs"]}
        n = int(np.asarray(outs["count"]).reshape(()))
        assert list(np.asarray(outs["tokens"]).reshape(-1)[:n]) == model.generate(prompt, limit), (prompt, limit)


class Rnn(torch.nn.Module):
    """An Elman RNN over time with torch's scan: the state and every step's output."""

    def __init__(self, reverse: bool = False):
        super().__init__()
        self.cell, self.inp, self.reverse = torch.nn.Linear(6, 6), torch.nn.Linear(3, 6), reverse

    def forward(self, h0, xs):
        from torch._higher_order_ops.scan import scan

        def step(h, x):
            h = torch.tanh(self.cell(h) + self.inp(x))
            return h, h.sum(-1)
        return scan(step, h0, xs, reverse=self.reverse)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_runs_an_rnn_over_time(reverse):
    torch.manual_seed(3)
    model = Rnn(reverse).eval()
    gen = torch.Generator().manual_seed(4)
    cases = [(torch.randn(2, 6, generator=gen), torch.randn(7, 2, 3, generator=gen)) for _ in range(3)]
    module = check_many(model, cases[0], cases, atol=ATOL)
    assert [op.name for op in module.main.body.ops if op.regions] == ["cuvil.while"]


def test_weight_quantization_reaches_the_loop_body():
    """fp16 weights inside the decoder's while body: the same tokens as the torch loop
    (this small model's argmax margins are far wider than fp16's weight rounding)."""
    model = decoder(0)
    compiled = cuvil.compile(model, decoder_inputs(model, *PROMPTS[0]), quantization="fp16")
    loop = next(op for op in compiled.ir.main.body.ops if op.name == "cuvil.while")
    weights = [op.operands[1].dtype for op in loop.regions[1].body.ops
               if op.name == "cuvil.matmul" and op.operands[1].defining_op is not None
               and op.operands[1].defining_op.name == "cuvil.constant"]
    assert weights and set(weights) == {"f16"}, weights
    for prompt, limit in PROMPTS[:3]:
        out, n = compiled(*[_np(t) for t in decoder_inputs(model, prompt, limit)])
        assert out[:int(n)].tolist() == model.generate(prompt, limit)


def test_cond_with_a_symbolic_batch_and_a_loop_swapping_its_values():
    from torch._higher_order_ops.while_loop import while_loop

    class F(torch.nn.Module):
        def forward(self, x):
            y = torch.cond(x.sum() > 0, lambda x: x * 3.0, lambda x: x - 1.0, (x,))
            _, a, b = while_loop(lambda i, a, b: i < 3, lambda i, a, b: (i + 1, b + 0.0, a + 1.0),
                                 (torch.zeros((), dtype=torch.int64), y, x))
            return a, b

    model = F().eval()
    gen = torch.Generator().manual_seed(6)
    compiled = cuvil.compile(model, (torch.randn(2, 4, generator=gen),), dynamic_shapes=[("batch", None)],
                             dim_bounds={"batch": (1, 8)})
    for n, sign in ((2, 1), (5, -1), (8, 1), (1, -1)):
        x = torch.randn(n, 4, generator=gen).abs() * sign
        got = compiled(x.numpy())
        for g, w in zip(got, model(x)):
            assert g.shape == tuple(w.shape)
            np.testing.assert_allclose(g, w.numpy(), rtol=0, atol=1e-6)
