"""What the pass tests share: golden-IR checks, the captured models, numeric comparison
and an arena simulator that runs a memory-planned function the way the backend lays
it out."""
from __future__ import annotations

import functools
import textwrap
from typing import Callable

import numpy as np
import torch

from cuvil.ir import Module, parse_module, print_module, run, verify
from cuvil.ir.interpreter import evaluate_op
from examples.models import bert, mlp, mobilenet_v2, randomize_norm_stats_, resnet
from tests.models_zoo import ZOO


# -- golden IR ------------------------------------------------------------------------------
def ir(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


def apply(pass_, text: str, weights: dict | None = None, verify_before: bool = True) -> Module:
    module = parse_module(ir(text), weights)
    if verify_before:
        verify(module)
    pass_.apply(module)
    verify(module)
    return module


def assert_golden(pass_, before: str, after: str, weights: dict | None = None,
                  verify_before: bool = True) -> Module:
    """Run `pass_` on IR `before`; the printed result must be `after` exactly."""
    module = apply(pass_, before, weights, verify_before)
    got = print_module(module)
    assert got == ir(after), f"pass {pass_.name} produced:\n{got}"
    return module


def const(module: Module, name: str) -> np.ndarray:
    return module.weights()[name]


# -- models -----------------------------------------------------------------------------------
def _bert():
    model = bert.BertEncoder(bert.BertConfig())
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # non-zero biases, so bias epilogues are exercised
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.bias.normal_(0.0, 0.02, generator=gen)
    return model, bert.example_inputs(seed=0, batch=2, seq=16)


MODELS: dict[str, Callable] = {
    "resnet18": lambda: (randomize_norm_stats_(resnet.resnet18(), 0), resnet.example_inputs(size=64)),
    "mobilenet_v2": lambda: (randomize_norm_stats_(mobilenet_v2.mobilenet_v2(), 0),
                             mobilenet_v2.example_inputs(size=64)),
    "bert": _bert,
    "mlp": lambda: (mlp.mlp(), mlp.example_inputs(batch=2)),
    **{name: functools.partial(builder, 0) for name, builder in ZOO.items()},
}


@functools.lru_cache(maxsize=None)
def _captured(name: str) -> tuple[str, dict, tuple]:
    from cuvil.frontends.torch import capture_torch
    model, inputs = MODELS[name]()
    module = capture_torch(model.eval(), inputs)
    return print_module(module), module.weights(), tuple(x.numpy() for x in inputs)


def captured(name: str) -> Module:
    """A fresh copy of model `name` as the torch frontend captures it."""
    text, weights, _ = _captured(name)
    return parse_module(text, weights)


def random_inputs(name: str, seed: int) -> list[np.ndarray]:
    """Seeded random float inputs; integer inputs (BERT's ids and mask) from the example,
    whose values must stay in range."""
    _, _, examples = _captured(name)
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(x.shape).astype(x.dtype) if x.dtype.kind == "f" else x for x in examples]


@functools.lru_cache(maxsize=None)
def reference(name: str, seed: int = 0) -> tuple:
    return run(captured(name), random_inputs(name, seed))


def assert_close(got, ref, what: str = "") -> None:
    """rtol 1e-5 and atol 1e-5 x max|ref| per output, same shapes and dtypes."""
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape and g.dtype == r.dtype, f"{what} output {i}: {g.shape} {g.dtype} vs {r.shape} {r.dtype}"
        scale = float(np.abs(r).max()) if r.size else 0.0
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * max(scale, 1e-30), err_msg=f"{what} output {i}")


# -- arena simulation ---------------------------------------------------------------------------
PLAN_ATTRS = ("arena_offset", "alias", "scratch_offset", "scratch_bytes")


def _evaluate_planned(op, args) -> np.ndarray:
    """evaluate_op without the planner's attributes (unary references take their attrs
    as keyword arguments and would choke on them)."""
    saved = op.attrs
    op.attrs = {k: v for k, v in saved.items() if k not in PLAN_ATTRS}
    try:
        return evaluate_op(op, args)[0]
    finally:
        op.attrs = saved


def run_in_arena(module: Module, inputs) -> tuple:
    """Run a memory-planned `main` with every intermediate stored at its arena_offset in
    one byte buffer, as generated code does: reshape aliases are not executed (they read
    their operand's bytes), ops read all operands before writing, and scratch areas are
    overwritten with garbage as their op starts. A plan that lets a live tensor be
    overwritten gives wrong outputs."""
    fn = module.main
    arena = np.full(fn.attrs["arena_size"], 0xFF, np.uint8)  # NaN for floats
    env: dict[int, np.ndarray] = {id(a): np.asarray(x) for a, x in zip(fn.args, inputs)}

    def read(v):
        if id(v) in env:
            return env[id(v)]
        off, t = v.defining_op.attrs["arena_offset"], v.type
        return arena[off:off + t.nbytes].view(t.np_dtype).reshape(t.shape).copy()

    for op in fn.body.ops:
        if op.name == "cuvil.return":
            return tuple(read(v) for v in op.operands)
        if op.name == "cuvil.constant":
            env[id(op.result)] = op.value
            continue
        if op.attrs.get("alias"):
            assert op.attrs["arena_offset"] == op.operands[0].defining_op.attrs["arena_offset"]
            continue
        if "scratch_offset" in op.attrs:  # a kernel may use its scratch before reading everything
            so = op.attrs["scratch_offset"]
            arena[so:so + op.attrs["scratch_bytes"]] = 0xFF
        args = [read(v) for v in op.operands]
        out = _evaluate_planned(op, args)
        if "arena_offset" in op.attrs:
            off = op.attrs["arena_offset"]
            arena[off:off + out.nbytes] = np.ascontiguousarray(out).view(np.uint8).reshape(-1)
        else:
            env[id(op.result)] = out
    raise AssertionError("no return")
