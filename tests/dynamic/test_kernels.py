"""Kernels with sizes known only at run time: each model is compiled once with symbolic
dims and run at several sizes within the bounds, against torch (or the interpreter)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cuvil
from cuvil.errors import BackendError, CuvilError
from cuvil.ir import run
from cuvil.ir.parser import parse_module

# One compile per model, then runs at these sizes: the bounds' ends, 1 and odd sizes that
# leave ragged GEMM row blocks and columns.
SIZES = [(1, 1), (2, 7), (3, 17), (5, 40)]
BOUNDS = {"b": (1, 5), "s": (1, 40)}


class Fn(nn.Module):
    def __init__(self, fn, *params):
        super().__init__()
        self.fn = fn
        self.params = nn.ParameterList(params)

    def forward(self, *xs):
        return self.fn(*xs, *self.params)


def _check(fn, make_inputs, dynamic, params=(), sizes=SIZES, tol=1e-5, jit=True):
    model = Fn(fn, *[nn.Parameter(p, requires_grad=False) for p in params]).eval()
    cm = cuvil.compile(model, make_inputs(2, 3), dynamic_shapes=dynamic, dim_bounds=BOUNDS, jit=jit)
    for b, s in sizes:
        xs = make_inputs(b, s)
        with torch.no_grad():
            ref = model(*xs)
        refs = ref if isinstance(ref, tuple) else (ref,)
        got = cm(*xs)
        for g, r in zip(got, refs):
            assert g.shape == tuple(r.shape), (b, s)
            r = r.numpy()
            scale = max(float(np.abs(r).max()), 1.0)
            assert float(np.abs(g - r).max()) <= tol * scale, (b, s, float(np.abs(g - r).max()))
    return cm


def _randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_linear_layers_with_a_symbolic_row_count():
    w1, w2 = _randn(0, 33, 16), _randn(1, 10, 33)
    _check(lambda x, w1, w2: F.linear(F.gelu(F.linear(x, w1)), w2),
           lambda b, s: (_randn(b * 100 + s, b, s, 16),), [("b", "s", 16)], (w1, w2))


def test_attention_scores_softmax_and_values():
    # QK^T has a symbolic N, softmax runs over it, and P @ V has a symbolic K.
    def attn(q, k, v, mask):
        scores = q @ k.transpose(-1, -2) / 4.0 + mask[:, None, None, :]
        return torch.softmax(scores, -1) @ v
    def inputs(b, s):
        mask = torch.zeros(b, s)
        mask[:, s // 2 + 1:] = -1e4
        return (_randn(s, b, 3, s, 16), _randn(s + 1, b, 3, s, 16), _randn(s + 2, b, 3, s, 16), mask)
    _check(attn, inputs, [("b", 3, "s", 16)] * 3 + [("b", "s")])


def test_norms_reductions_and_pooling_over_symbolic_dims():
    g = _randn(3, 12)
    def f(x, m, g):
        y = F.layer_norm(x, (12,), g)
        mean = (y * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1.0)
        return mean, y.amax(1), y.mean(dim=(0, 1)), torch.log_softmax(x, 1)
    def inputs(b, s):
        m = (torch.arange(s)[None, :] < torch.arange(1, b + 1)[:, None] * 3).float()
        return _randn(b + s, b, s, 12), m
    _check(f, inputs, [("b", "s", 12), ("b", "s")], (g,))


def test_data_movement_with_symbolic_dims():
    table, pos = _randn(4, 50, 8), torch.arange(40)[None, :]
    def f(x, ids, table):
        t = x.transpose(0, 1).reshape(x.shape[1], -1)               # [s, b*8]
        c = torch.cat([x, x * 2.0], 1)[:, 1:]                        # concat along s, slice from 1
        e = F.embedding(ids, table) + F.embedding(pos[:, :x.shape[1]], table)
        return t, c, e, F.pad(x, (0, 0, 2, 1)), x[:, 0], x.expand(2, -1, -1, -1).sum(0)
    def inputs(b, s):
        return _randn(s, b, s, 8), torch.randint(0, 50, (b, s), generator=torch.Generator().manual_seed(s))
    _check(f, inputs, [("b", "s", 8), ("b", "s")], (table,), tol=1e-6)


def test_convolution_network_with_a_symbolic_batch():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 8, 3, groups=8), nn.Conv2d(8, 16, 1), nn.ReLU6(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5)).eval()
    net[1].running_mean.uniform_(-0.5, 0.5)
    net[1].running_var.uniform_(0.5, 2.0)
    _check(lambda x, *p: net(x), lambda b, s: (_randn(b, b, 3, 12, 12),), [("b", 3, 12, 12)],
           sizes=[(1, 1), (4, 1), (5, 1)])


def test_shared_library_runs_take_the_shapes_of_their_inputs():
    """The deployed path (runtime + generated C API): same model, several shapes, one context."""
    w = _randn(7, 6, 24)
    cm = _check(lambda x, w: torch.softmax(x @ w, -1).sum(1), lambda b, s: (_randn(s, b, s, 6),),
                [("b", "s", 6)], (w,), jit=False)
    assert cm.symbols == ["b", "s"] and cm.bounds == BOUNDS
    with pytest.raises(CuvilError, match=r"s = 41 is outside its bounds \[1, 40\]"):
        cm(np.zeros((1, 41, 6), np.float32))
    with pytest.raises(CuvilError, match=r"expected shape \['b', 's', 6\], got \[1, 4, 5\]"):
        cm(np.zeros((1, 4, 5), np.float32))


def test_arena_is_planned_for_the_upper_bounds():
    text = """
    func @main(%0: tensor<[n, 64], f32> "x") -> ("y") attributes {dim_bounds = {n = [1, 100]}} {
      %1 = cuvil.exp(%0) {} : tensor<[n, 64], f32>
      %2 = cuvil.reduce_sum(%1) {axes = [1], keepdims = false} : tensor<[n], f32>
      cuvil.return(%2)
    }"""
    cm = cuvil.compile(parse_module(text), jit=True)
    assert cm.arena_size >= 100 * 64 * 4
    x = np.random.default_rng(0).standard_normal((100, 64)).astype(np.float32)
    np.testing.assert_allclose(cm(x)[0], run(parse_module(text), [x])[0], rtol=1e-5)


def test_input_dims_must_be_plain_bounded_symbols():
    poly = """
    func @main(%0: tensor<[2*n, 4], f32> "x") -> ("y") attributes {dim_bounds = {n = [1, 8]}} {
      %1 = cuvil.relu(%0) {} : tensor<[2*n, 4], f32>
      cuvil.return(%1)
    }"""
    with pytest.raises(BackendError, match="input 'x' has the dim '2\\*n'"):
        cuvil.compile(parse_module(poly), jit=True)
    unbounded = poly.replace("2*n", "n").replace(" attributes {dim_bounds = {n = [1, 8]}}", "")
    with pytest.raises(CuvilError, match="the symbolic dim .n. has no bounds"):
        cuvil.compile(parse_module(unbounded), jit=True)


def test_dynamic_shapes_need_names_and_bounds():
    model = Fn(lambda x: x * 2).eval()
    x = torch.ones(2, 3)
    with pytest.raises(CuvilError, match=r"dim_bounds\['b'\] must be \(min, max\).*got \(0, 4\)"):
        cuvil.compile(model, (x,), dynamic_shapes=[("b", 3)], dim_bounds={"b": (0, 4)})
    with pytest.raises(CuvilError, match="need both dynamic_shapes"):
        cuvil.compile(model, (x,), dynamic_shapes=[("b", 3)])
    with pytest.raises(CuvilError, match="'b' has no bounds"):
        cuvil.compile(model, (x,), dynamic_shapes=[("b", 3)], dim_bounds={"c": (1, 2)})
    with pytest.raises(CuvilError, match="size 1 in the symbolic dim 'b'.*size >= 2"):
        cuvil.compile(model, (torch.ones(1, 3),), dynamic_shapes=[("b", 3)], dim_bounds={"b": (1, 4)})


def test_specialisations_are_compiled_alongside_and_dispatched():
    from cuvil.backend.llvm.codegen import generate
    from cuvil.backend.llvm.select import KernelTarget, kernel_passes
    from cuvil.frontends.torch import capture_torch
    from cuvil.passes.pipeline import default_pipeline, run_pipeline

    w = _randn(9, 16, 8)
    model = Fn(lambda x, w: torch.softmax(x @ w, 1).mean(1), nn.Parameter(w, requires_grad=False)).eval()
    kw = dict(dynamic_shapes=[("b", "s", 16)], dim_bounds=BOUNDS)
    specs = [{"b": 1, "s": 17}, {"s": 40}]
    module = capture_torch(model, (_randn(0, 2, 3, 16),), **kw)
    run_pipeline(module, default_pipeline(**kernel_passes(KernelTarget(16))))
    gen = generate(module, "m", specialize=specs)
    for name in ("m_forward_any", "m_forward_s0", "m_forward_s1"):
        assert f'define internal void @"{name}"' in gen.llvm_ir
    plain = generate(module, "m")
    assert gen.kernels > plain.kernels  # the specialised ones come on top of the general kernels
    cm = cuvil.compile(model, (_randn(0, 2, 3, 16),), specialize=specs, **kw)
    for b, s in [(1, 17), (3, 40), (2, 17), (5, 9)]:  # both specialisations, then the general code
        x = _randn(b * s, b, s, 16)
        with torch.no_grad():
            np.testing.assert_allclose(cm(x)[0], model(x).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(BackendError, match=r"specialize\[0\]: s = 41 is outside its bounds \[1, 40\]"):
        generate(module, "m", specialize=[{"s": 41}])
    with pytest.raises(BackendError, match=r"'t' is not a symbolic dim"):
        generate(module, "m", specialize=[{"t": 2}])


def test_symbolic_code_generation_is_deterministic():
    from cuvil.backend.llvm.codegen import generate
    from cuvil.backend.llvm.select import KernelTarget, kernel_passes
    from cuvil.backend.llvm.target import compile_to_object, host_target
    from cuvil.frontends.torch import capture_torch
    from cuvil.passes.pipeline import default_pipeline, run_pipeline

    w = _randn(3, 16, 8)
    outputs = []
    for _ in range(2):
        model = Fn(lambda x, w: torch.softmax(x @ w, 1), nn.Parameter(w.clone(), requires_grad=False)).eval()
        module = capture_torch(model, (_randn(0, 2, 3, 16),), dynamic_shapes=[("b", "s", 16)], dim_bounds=BOUNDS)
        run_pipeline(module, default_pipeline(**kernel_passes(KernelTarget.of(host_target()))))
        gen = generate(module, "m", specialize=[{"s": 8}])
        outputs.append((gen.llvm_ir, gen.weights, compile_to_object(gen.llvm_ir, host_target())))
    assert outputs[0] == outputs[1]
