"""The ONNX package's own backend node tests, for every op the ONNX frontend claims,
through `cuvil.compile` (native code); prints how many pass.

The onnx wheel ships the node test definitions (`onnx/backend/test/case/node/*.py`:
each builds a one-node model and computes its expected outputs); the data files
`onnx/backend/test/data/node/*/model.onnx` + `test_data_set_*/*.pb` that older wheels
also carried are generated from exactly these definitions (`backend-test-tools
generate-data`). By default the cases are collected from the definitions in memory;
`--data-dir DIR` reads such generated files instead.

Node tests feed everything as graph inputs, shapes and axes included. An ahead-of-time
compiler needs those at compile time, as exported models carry them (initializers or
Constant nodes): inputs that only feed such operands (STATIC_OPERANDS) are baked into
the model as initializers with the case's values before capture.

A case is *claimed* when every op of its model has a handler in the ONNX frontend
(`cuvil.frontends.onnx.handlers()`); each claimed case is captured, compiled and run
on its data sets and compared with the expected outputs at the case's tolerances
(ONNX's own defaults: rtol 1e-3, atol 1e-7; NaNs equal; dtypes must match).

    python benchmarks/onnx_node_tests.py [--jit] [--verbose] [--only SUBSTRING] [--data-dir DIR]
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "compiler"))


@dataclass
class Case:
    name: str
    model: object                      # onnx.ModelProto
    data_sets: list                    # [(inputs, expected outputs)]
    rtol: float = 1e-3
    atol: float = 1e-7


@dataclass
class Result:
    total: int = 0                     # node test cases found
    claimed: list = field(default_factory=list)
    passed: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)  # name -> first line of the reason


def collect(data_dir: str | None = None) -> list[Case]:
    """The node test cases: from the wheel's definitions, or from generated files."""
    if data_dir:
        return _from_files(data_dir)
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return [Case(c.name, c.model, list(c.data_sets or []), c.rtol, c.atol) for c in cases if c.kind == "node"]


def _from_files(data_dir: str) -> list[Case]:
    import onnx
    from onnx import numpy_helper
    cases = []
    for model_path in sorted(glob.glob(os.path.join(data_dir, "*", "model.onnx"))):
        case_dir = os.path.dirname(model_path)
        sets = []
        for ds in sorted(glob.glob(os.path.join(case_dir, "test_data_set_*"))):
            def read(kind):
                out = []
                for p in sorted(glob.glob(os.path.join(ds, f"{kind}_*.pb")), key=lambda s: int(s.rsplit("_", 1)[1][:-3])):
                    t = onnx.TensorProto()
                    t.ParseFromString(Path(p).read_bytes())
                    out.append(numpy_helper.to_array(t))
                return out
            sets.append((read("input"), read("output")))
        cases.append(Case(os.path.basename(case_dir), onnx.load(model_path), sets))
    return cases


# op type -> operand positions the ONNX frontend needs at compile time.
STATIC_OPERANDS = {
    "Reshape": {1}, "Expand": {1}, "Tile": {1}, "ConstantOfShape": {0}, "Range": {0, 1, 2},
    "Slice": {1, 2, 3, 4}, "Split": {1}, "Squeeze": {1}, "Unsqueeze": {1}, "Pad": {1, 2, 3},
    "Clip": {1, 2}, "Dropout": {1, 2},
    "Loop": {0, 1},  # scan outputs need a constant trip count and condition (their length)
    "NonMaxSuppression": {2, 3, 4},  # the per-class limit and thresholds are attributes of cuvil.nms
    **{op: {1} for op in (
        "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare",
        "ReduceLogSum", "ReduceLogSumExp")},
}


def bake_static_inputs(model, inputs: list):
    """(model with the graph inputs that static operands depend on made initializers,
    the other inputs). Dependence is followed back through the nodes that
    compute those operands, stopping at Shape (which reads no values)."""
    from onnx import numpy_helper
    producer = {o: n for n in model.graph.node for o in n.output}
    needed, stack = set(), [name for n in model.graph.node for pos, name in enumerate(n.input)
                            if pos in STATIC_OPERANDS.get(n.op_type, ()) and name]
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        node = producer.get(name)
        if node is not None and node.op_type not in ("Shape", "Size"):
            stack.extend(i for i in node.input if i)
    inits = {t.name for t in model.graph.initializer}
    graph_inputs = [vi for vi in model.graph.input if vi.name not in inits]
    bake = {vi.name: x for vi, x in zip(graph_inputs, inputs) if vi.name in needed}
    if not bake:
        return model, inputs
    baked = type(model)()
    baked.CopyFrom(model)
    kept = [vi for vi in baked.graph.input if vi.name not in bake]
    del baked.graph.input[:]
    baked.graph.input.extend(kept)
    baked.graph.initializer.extend(numpy_helper.from_array(np.asarray(x), name) for name, x in bake.items())
    return baked, [x for vi, x in zip(graph_inputs, inputs) if vi.name not in bake]


def claims(model) -> bool:
    """Whether every op of the model (and nothing but plain tensors) is handled."""
    from cuvil.frontends.onnx import handlers
    g = model.graph
    if any(n.domain not in ("", "ai.onnx") or n.op_type not in handlers() for n in g.node):
        return False
    return all(vi.type.HasField("tensor_type") for vi in list(g.input) + list(g.output))


def run_case(case: Case, jit: bool) -> str | None:
    """None if the case passes, else the reason."""
    import cuvil
    from cuvil.frontends.onnx import capture_onnx
    from onnx import TensorProto, numpy_helper
    compiled, shapes = None, None
    for inputs, expected in case.data_sets:
        as_array = lambda x: numpy_helper.to_array(x) if isinstance(x, TensorProto) else (  # noqa: E731
            np.asarray(x) if isinstance(x, np.generic) else x)
        inputs, expected = [as_array(x) for x in inputs], [as_array(x) for x in expected]
        if any(not isinstance(x, np.ndarray) or x.dtype == object for x in inputs):
            return "non-tensor inputs"
        model, arrays = bake_static_inputs(case.model, list(inputs))
        key = [(a.shape, a.dtype) for a in inputs]
        if compiled is None or key != shapes:
            module = capture_onnx(model, arrays)
            compiled, shapes = cuvil.compile(module, jit=jit), key
        got = compiled(*arrays)
        if len(got) != len(expected):
            return f"{len(got)} outputs, expected {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            e = np.asarray(e)
            if g.shape != e.shape or g.dtype != e.dtype:
                return f"output {i}: {g.dtype}{list(g.shape)}, expected {e.dtype}{list(e.shape)}"
            if e.dtype.kind in "biu":
                if not np.array_equal(g, e):
                    return f"output {i}: values differ"
            elif not np.allclose(g, e, rtol=case.rtol, atol=case.atol, equal_nan=True):
                err = np.abs(g.astype(np.float64) - e.astype(np.float64))
                return f"output {i}: max abs error {np.nanmax(err):.3g}"
    return None


def run_all(jit: bool = False, only: str = "", data_dir: str | None = None, log=None) -> Result:
    res = Result()
    for case in collect(data_dir):
        if only and only not in case.name:
            continue
        res.total += 1
        if not claims(case.model):
            continue
        res.claimed.append(case.name)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                reason = run_case(case, jit)
        except Exception as e:  # a failing case is a result, not a crash of the run
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if reason is None:
            res.passed.append(case.name)
        else:
            res.failed[case.name] = reason
        if log:
            log(f"{'PASS' if reason is None else 'FAIL'} {case.name}" + (f": {reason}" if reason else ""))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jit", action="store_true", help="JIT the LLVM IR in-process instead of linking a shared library")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--data-dir", help="read generated node test data (DIR/*/model.onnx) instead")
    ap.add_argument("--verbose", action="store_true", help="print every case's result")
    args = ap.parse_args(argv)
    start = time.monotonic()
    res = run_all(args.jit, args.only, args.data_dir, print if args.verbose else None)
    if not args.verbose:
        for name, reason in sorted(res.failed.items()):
            print(f"FAIL {name}: {reason}")
    ops = Counter(n.split("_")[1] for n in res.claimed)
    print(f"claimed op families: {len(ops)}; time {time.monotonic() - start:.0f}s")
    print(f"ONNX node tests: {len(res.passed)} passed, {len(res.failed)} failed "
          f"(of {len(res.claimed)} claimed; {res.total} node tests in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
