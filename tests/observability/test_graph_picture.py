"""`cuvil inspect model.cvir --graph out.svg`: the SVG Graphviz draws has one node per op
of the optimised IR (and per input) and one edge per use of a value, with the op's name,
result types, fused epilogue, kernel plan and arena offset in its label."""
from __future__ import annotations

import collections
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from torch import nn

import cuvil
from cuvil.backend.llvm.target import resolve_target
from cuvil.ir import read_bundle
from cuvil.options import CompileOptions
from cuvil.passes.pipeline import optimise

SVG = "{http://www.w3.org/2000/svg}"
CUVIL = [sys.executable, "-m", "cuvil.cli"]


class Residual(nn.Module):
    """A conv with a fused epilogue, a value used twice (the skip) and two outputs."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        y = torch.relu(self.conv(x)) + x
        return self.fc(y.flatten(1)), y.mean()


def _svg_graph(path: Path) -> tuple[dict[str, str], collections.Counter]:
    """The SVG's nodes (title -> label text) and edges (a multiset of (tail, head))."""
    root = ET.parse(path).getroot()
    nodes, edges = {}, collections.Counter()
    for g in root.iter(f"{SVG}g"):
        title = g.findtext(f"{SVG}title")
        text = "\n".join(t.text or "" for t in g.iter(f"{SVG}text"))
        if g.get("class") == "node":
            nodes[title] = text
        elif g.get("class") == "edge":
            tail, head = title.split("->")
            edges[tail, head] += 1
    return nodes, edges


def _ir_graph(module) -> tuple[dict[str, object], collections.Counter]:
    """The IR's ops and inputs by node name, and every use of every value as an edge."""
    fn = module.main
    names = {id(a): f"arg{k}" for k, a in enumerate(fn.args)}
    names.update({id(op): f"op{i}" for i, op in enumerate(fn.body.ops)})
    nodes = {**{f"arg{k}": a for k, a in enumerate(fn.args)}, **{f"op{i}": op for i, op in enumerate(fn.body.ops)}}
    edges = collections.Counter()
    values = list(fn.args) + [r for op in fn.body.ops for r in op.results]
    for v in values:
        source = names[id(v.defining_op) if v.defining_op is not None else id(v)]
        for user in v.uses:
            edges[source, names[id(user)]] += 1
    return nodes, edges


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("graph") / "residual.cvir"
    cuvil.capture(Residual().eval(), (torch.randn(1, 4, 6, 6),), path)
    return path


@pytest.mark.parametrize("raw", [False, True], ids=["optimised", "raw"])
def test_graph_svg_has_the_irs_ops_and_uses(bundle, tmp_path, raw):
    out = tmp_path / "graph.svg"
    proc = subprocess.run(CUVIL + ["inspect", str(bundle), "--summary", "--graph", str(out)] + (["--raw"] if raw else []),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    module = read_bundle(bundle)
    if not raw:
        optimise(module, CompileOptions(), resolve_target("host", "", ""))
    ir_nodes, ir_edges = _ir_graph(module)
    nodes, edges = _svg_graph(out)
    assert set(nodes) == set(ir_nodes)
    assert edges == ir_edges
    assert f"graph: wrote {out} ({len(ir_nodes)} nodes)" in proc.stdout
    assert sum(ir_edges.values()) >= len(module.main.body.ops)  # every op is used or uses something
    for name, op in ir_nodes.items():
        label = nodes[name]
        if name.startswith("arg"):
            assert str(op.type).replace(" ", "") in label.replace(" ", "")
            continue
        if op.name == "cuvil.return":
            assert "outputs:" in label
            continue
        assert f"{name}: {op.name.removeprefix('cuvil.')}" in label
        for r in op.results:
            assert str(r.type) in label
        if "arena_offset" in op.attrs:
            assert f"arena @{op.attrs['arena_offset']}" in label
        if op.attrs.get("post"):
            assert "fused: " + " -> ".join(p[0] for p in op.attrs["post"]) in label
        if op.attrs.get("kernel_plan", {}).get("form"):
            assert f"form={op.attrs['kernel_plan']['form']}" in label
    if raw:
        assert not any("arena @" in label for label in nodes.values())
    else:  # the optimised graph shows what the passes decided
        assert any("fused: " in label for label in nodes.values())
        assert any("arena @" in label for label in nodes.values())


def test_graph_needs_a_bundle(tmp_path):
    manifest = tmp_path / "m.json"
    manifest.write_text("{}")
    proc = subprocess.run(CUVIL + ["inspect", str(manifest), "--graph", str(tmp_path / "g.svg")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--graph draws a .cvir bundle's graph" in proc.stderr
    assert not (tmp_path / "g.svg").exists()
