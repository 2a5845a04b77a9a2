"""PyTorch's own OpInfo samples (float32, CPU) through `cuvil.compile`, compared with torch
eager; prints the pass count per op and overall.

`torch.testing._internal.common_methods_invocations.op_db` describes every ATen-level op
with a `sample_inputs` generator: the shapes and arguments PyTorch's own test suite
checks (0-d tensors, unbatched inputs, optional outputs, keyword variants). For each op
in OPS (the ops issue #41 names, and every op the PyTorch frontend claims) and each of
its float32 samples, the sample's tensors become the model's inputs and everything else
(ints, dims, flags) is baked into the model, which is captured with torch.export,
compiled to native code and run; every output is compared with torch's in shape, dtype
and value (TOLERANCES; integers and bools exactly, NaNs equal).

Samples that cannot pass are listed apart with the reason (`excluded`): a dtype that the
IR lacks (complex, bfloat16), random or training-only behaviour (dropout with
training=True), outputs that are not tensors. Everything else that fails is a failure.

    python benchmarks/opinfo.py [--jit] [--only NAME] [--every N] [--per-op N] [--verbose] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "compiler"))

# OpInfo names (every variant of each is run). First the ops that issue #41 names ...
ISSUE_OPS = (
    "max", "min", "argmax", "argmin", "topk", "sort", "argsort", "any", "all", "cumsum", "cumprod",
    "logsumexp", "std", "var", "prod", "norm", "linalg.vector_norm",
    "sin", "cos", "tan", "atan", "atan2", "sinh", "cosh", "asin", "acos", "erf", "erfinv", "log1p", "expm1",
    "floor", "ceil", "round", "trunc", "sign", "abs", "reciprocal", "fmod", "remainder",
    "triu", "tril", "meshgrid", "arange", "scatter", "scatter_add", "scatter_reduce", "index_put",
    "index_select", "index_add", "gather", "take_along_dim", "masked_fill", "nn.functional.one_hot",
    "einsum", "minimum", "maximum", "diff", "flip", "roll", "repeat_interleave",
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d", "nn.functional.conv_transpose1d",
    "nn.functional.conv_transpose2d", "nn.functional.avg_pool1d", "nn.functional.avg_pool3d",
    "nn.functional.max_pool1d", "nn.functional.max_pool3d", "nn.functional.group_norm",
    "nn.functional.instance_norm", "nn.functional.rms_norm", "nn.functional.interpolate",
    "nn.functional.pixel_shuffle", "nn.functional.pixel_unshuffle", "nn.functional.grid_sample",
    "nn.functional.unfold", "nn.functional.scaled_dot_product_attention",
)
# ... then the ones the frontend already claims (torch.handlers()).
CLAIMED_OPS = (
    "add", "sub", "mul", "div", "pow", "rsub", "eq", "ne", "lt", "le", "gt", "ge", "neg", "sqrt", "rsqrt",
    "exp", "log", "sigmoid", "tanh", "clamp", "clamp_min", "clamp_max", "where", "logical_not", "logical_and",
    "logical_or", "bitwise_not", "bitwise_and", "bitwise_or", "clone", "contiguous",
    "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "zeros", "ones", "full",
    "scalar_tensor", "matmul", "mm", "bmm", "addmm", "t", "mean", "sum", "amax", "amin", "softmax",
    "log_softmax", "repeat", "stack", "cat", "reshape", "view", "flatten", "unflatten", "squeeze",
    "unsqueeze", "expand", "expand_as", "broadcast_to", "permute", "transpose", "narrow", "split",
    "split_with_sizes", "chunk", "unbind", "select", "constant_pad_nd", "__getitem__",
    "nn.functional.relu", "nn.functional.relu6", "nn.functional.silu", "nn.functional.gelu",
    "nn.functional.hardswish", "nn.functional.hardsigmoid", "nn.functional.hardtanh",
    "nn.functional.leaky_relu", "nn.functional.elu", "nn.functional.prelu", "nn.functional.softplus",
    "nn.functional.mish", "nn.functional.linear", "nn.functional.batch_norm", "nn.functional.layer_norm",
    "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool1d",
    "nn.functional.adaptive_avg_pool2d", "nn.functional.adaptive_max_pool2d", "nn.functional.embedding",
    "nn.functional.pad", "nn.functional.dropout", "nn.functional.upsample_nearest",
    "nn.functional.upsample_bilinear", "native_layer_norm", "native_batch_norm",
)
OPS = tuple(dict.fromkeys(ISSUE_OPS + CLAIMED_OPS))

# torch.testing's float32 defaults (rtol 1.3e-6, atol 1e-5), widened where Cuvil and
# torch accumulate in a different order (GEMM blocking, tree vs. serial sums) or use
# different float32 approximations of a transcendental function.
DEFAULT_TOL = (1.3e-6, 1e-5)
ACCUMULATING = (1e-4, 1e-5)
TOLERANCES = {
    **{op: ACCUMULATING for op in (
        "matmul", "mm", "bmm", "addmm", "einsum", "nn.functional.linear", "nn.functional.conv1d",
        "nn.functional.conv2d", "nn.functional.conv3d", "nn.functional.conv_transpose1d",
        "nn.functional.conv_transpose2d", "nn.functional.scaled_dot_product_attention", "sum", "mean",
        "cumsum", "cumprod", "prod", "std", "var", "logsumexp", "norm", "linalg.vector_norm", "softmax",
        "log_softmax", "nn.functional.layer_norm", "native_layer_norm", "nn.functional.group_norm",
        "nn.functional.instance_norm", "nn.functional.rms_norm", "nn.functional.batch_norm",
        "native_batch_norm", "nn.functional.avg_pool1d", "nn.functional.avg_pool2d", "nn.functional.avg_pool3d",
        "nn.functional.adaptive_avg_pool1d", "nn.functional.adaptive_avg_pool2d", "nn.functional.interpolate",
        "nn.functional.upsample_bilinear", "nn.functional.grid_sample", "index_add", "scatter_add",
        "scatter_reduce", "index_put", "pow", "erfinv", "nn.functional.gelu", "nn.functional.mish",
        "nn.functional.softplus", "nn.functional.silu", "sigmoid", "tanh", "exp", "log", "expm1", "log1p",
        "sinh", "cosh", "tan", "atan", "atan2", "asin", "acos", "erf", "nn.functional.elu", "rsqrt", "diff")},
}
CUVIL_DTYPES = {"float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"}


@dataclass
class Result:
    per_op: dict = field(default_factory=lambda: defaultdict(Counter))  # op -> {passed, failed, excluded}
    failed: dict = field(default_factory=lambda: defaultdict(list))     # op -> [(sample, reason)]
    excluded: dict = field(default_factory=lambda: defaultdict(list))   # op -> [(sample, reason)]
    seconds: list = field(default_factory=list)                         # compile time per sample

    @property
    def passed(self) -> int:
        return sum(c["passed"] for c in self.per_op.values())

    @property
    def counted(self) -> int:
        return sum(c["passed"] + c["failed"] for c in self.per_op.values())


class Excluded(Exception):
    """A sample that cannot pass, for the reason given."""


def op_infos(names=OPS):
    """(label, OpInfo) for every variant of each named op in torch's op_db."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    wanted = set(names)
    out = [(o.name + (f".{o.variant_test_name}" if o.variant_test_name else ""), o)
           for o in op_db if o.name in wanted]
    missing = wanted - {o.name for _, o in out}
    if missing:
        raise SystemExit(f"not in this torch's op_db: {sorted(missing)}")
    return out


def samples(info):
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(info.sample_inputs("cpu", torch.float32, requires_grad=False))


def _model(info, sample):
    """(an nn.Module taking the sample's tensors, those tensors)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten
    leaves, spec = tree_flatten((sample.input, list(sample.args), dict(sample.kwargs)))
    slots = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    tensors = [leaves[i] for i in slots]
    for t in tensors:
        if str(t.dtype).replace("torch.", "") not in CUVIL_DTYPES:
            raise Excluded(f"input dtype {t.dtype} (not in the IR)")
    if "dropout" in info.name and sample.kwargs.get("training", True) and sample.kwargs.get("p", 0.5):
        raise Excluded("training=True (random)")
    if sample.kwargs.get("dropout_p"):
        raise Excluded("dropout_p > 0 (random)")

    class Sample(torch.nn.Module):
        def forward(self, *xs):
            filled = list(leaves)
            for i, x in zip(slots, xs):
                filled[i] = x
            inp, args, kwargs = tree_unflatten(filled, spec)
            return info.op(inp, *args, **kwargs)
    return Sample(), [t.detach().clone().contiguous() for t in tensors]


def _outputs(out) -> list:
    import torch
    from torch.utils._pytree import tree_flatten
    leaves, _ = tree_flatten(out)
    if not leaves or any(not isinstance(t, torch.Tensor) for t in leaves):
        raise Excluded(f"output {type(out).__name__} is not a tensor or tuple of tensors")
    for t in leaves:
        if str(t.dtype).replace("torch.", "") not in CUVIL_DTYPES:
            raise Excluded(f"output dtype {t.dtype} (not in the IR)")
    return [t.detach().contiguous().numpy() for t in leaves]


def compare(got, want, rtol: float, atol: float) -> str | None:
    """None when `got` matches torch's outputs, else what differs."""
    if len(got) != len(want):
        return f"{len(got)} outputs, torch gives {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)}, torch gives {w.dtype}{list(w.shape)}"
        if w.dtype.kind in "biu":
            if not np.array_equal(g, w):
                return f"output {i}: values differ"
        elif not np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
            err = np.abs(g.astype(np.float64) - w.astype(np.float64))
            return f"output {i}: max abs error {np.nanmax(err):.3g} (|torch| up to {np.nanmax(np.abs(w)):.3g})"
    return None


def run_sample(info, sample, jit: bool, seconds: list) -> str | None:
    """None if the sample passes, else the reason; raises Excluded for one that cannot."""
    import torch

    import cuvil
    module, tensors = _model(info, sample)
    with torch.no_grad():
        try:
            want = _outputs(module(*[t.clone() for t in tensors]))
        except Excluded:
            raise
        except Exception as e:
            raise Excluded(f"torch eager raises {type(e).__name__}") from None
    t0 = time.perf_counter()
    compiled = cuvil.compile(module, tensors, jit=jit)
    seconds.append(time.perf_counter() - t0)
    got = compiled(*[t.numpy() for t in tensors])
    rtol, atol = TOLERANCES.get(info.name, DEFAULT_TOL)
    return compare(list(got), want, rtol, atol)


def _first_line(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"[:300]


def run_all(names=OPS, jit: bool = False, every: int = 1, per_op: int = 0, log=None) -> Result:
    """Every `every`-th sample of each op variant (all by default), at most `per_op` of
    them (0: no limit)."""
    res = Result()
    for label, info in op_infos(names):
        for k, sample in enumerate(samples(info)):
            if k % every or (per_op and k >= every * per_op):
                continue
            tag = f"{label}[{k}]"
            try:
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")
                    reason = run_sample(info, sample, jit, res.seconds)
            except Excluded as e:
                res.per_op[info.name]["excluded"] += 1
                res.excluded[info.name].append((tag, str(e)))
                continue
            except Exception as e:  # a failing sample is a result, not a crash of the run
                reason = _first_line(e)
            res.per_op[info.name]["passed" if reason is None else "failed"] += 1
            if reason is not None:
                res.failed[info.name].append((tag, reason))
            if log:
                log(f"{'PASS' if reason is None else 'FAIL'} {tag}" + (f": {reason}" if reason else ""))
    return res


def report(res: Result, verbose: bool = False) -> str:
    lines = [f"{'op':44s} {'pass':>5s} {'fail':>5s} {'excl':>5s}"]
    for op in OPS:
        c = res.per_op.get(op)
        if c is None:
            continue
        lines.append(f"{op:44s} {c['passed']:5d} {c['failed']:5d} {c['excluded']:5d}")
    total = res.counted
    lines.append(f"overall: {res.passed}/{total} samples pass ({100.0 * res.passed / max(total, 1):.1f}%), "
                 f"{sum(c['excluded'] for c in res.per_op.values())} excluded")
    if res.seconds:
        s = sorted(res.seconds)
        lines.append(f"compile time per sample: median {s[len(s) // 2]:.2f} s, max {s[-1]:.2f} s, "
                     f"total {sum(s):.0f} s")
    reasons = Counter(r.split(":")[0] + ":" + r.split(":")[1][:60] if r.count(":") else r
                      for lst in res.failed.values() for _, r in lst)
    lines.append("failures by reason:")
    lines += [f"  {n:4d}  {r}" for r, n in reasons.most_common(40)]
    lines.append("excluded (cannot pass):")
    excl = Counter((op, r) for op, lst in res.excluded.items() for _, r in lst)
    lines += [f"  {n:4d}  {op}: {r}" for (op, r), n in sorted(excl.items())]
    if verbose:
        lines.append("failed samples:")
        lines += [f"  {tag}: {r}" for lst in res.failed.values() for tag, r in lst]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jit", action="store_true", help="JIT the LLVM IR in-process instead of linking a shared library")
    ap.add_argument("--only", action="append", help="run only this OpInfo name (repeatable)")
    ap.add_argument("--every", type=int, default=1, help="run every N-th sample of each op")
    ap.add_argument("--per-op", type=int, default=0, help="at most this many samples of each op variant")
    ap.add_argument("--verbose", action="store_true", help="print every sample's result")
    ap.add_argument("--json", help="write per-op counts and failures to this file")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    res = run_all(tuple(args.only) if args.only else OPS, args.jit, args.every, args.per_op, print if args.verbose else None)
    print(report(res, args.verbose))
    if args.json:
        Path(args.json).write_text(json.dumps({"per_op": {k: dict(v) for k, v in res.per_op.items()},
                                               "failed": res.failed, "excluded": res.excluded}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
