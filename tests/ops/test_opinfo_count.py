"""PyTorch's OpInfo samples through Cuvil (benchmarks/opinfo.py): the pass count of each
op must not drop.

The full run (every float32 sample of every op, over 6,000) takes a quarter of an hour
on two cores, most of it in the pooling ops' thousands of geometries; this test runs the
first SAMPLES_PER_VARIANT samples of every op variant and compares each op's passes
with the floor recorded in opinfo_floor.json. After a change that makes more pass,
re-record the floor with `.venv/bin/python -m tests.ops.test_opinfo_count`.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOOR = Path(__file__).with_name("opinfo_floor.json")
SAMPLES_PER_VARIANT = 3


def _script():
    spec = importlib.util.spec_from_file_location("opinfo", ROOT / "benchmarks" / "opinfo.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, script)  # dataclasses look their module up
    spec.loader.exec_module(script)
    return script


def _run():
    script = _script()
    # jit: the same native code as the linked library, without linking each sample
    return script, script.run_all(jit=True, per_op=SAMPLES_PER_VARIANT)


def test_opinfo_pass_count_does_not_drop():
    script, res = _run()
    floor = json.loads(FLOOR.read_text())
    assert set(floor) <= set(script.OPS), f"ops in the floor but not run: {sorted(set(floor) - set(script.OPS))}"
    dropped = {op: (res.per_op.get(op, {}).get("passed", 0), want) for op, want in floor.items()
               if res.per_op.get(op, {}).get("passed", 0) < want}
    newly = [f"{tag}: {why}" for op in dropped for tag, why in res.failed.get(op, [])][:20]
    assert not dropped, f"OpInfo samples passing dropped (op: (now, floor)): {dropped}\n" + "\n".join(newly)
    assert res.passed >= sum(floor.values()) and res.counted > 300


if __name__ == "__main__":  # re-record the floor
    _, res = _run()
    FLOOR.write_text(json.dumps({op: c["passed"] for op, c in sorted(res.per_op.items())}, indent=1) + "\n")
    print(f"{res.passed}/{res.counted} samples pass; floor written to {FLOOR}")
