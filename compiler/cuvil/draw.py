"""Pictures of a model: the optimised graph as Graphviz DOT and SVG (`cuvil inspect --graph`).

Every op of `main` is a node (`op<i>`, i its index in the body; constants and the
`cuvil.return` included) and every input a node (`arg<k>`); every use of a value is an
edge from the node that defines it to the op that uses it, labelled with the value's
type. A node shows the op, its result types, the fused epilogue (`post`), the kernel
plan, the arena offset and the source line. `dot` (Debian's `graphviz` package) lays it
out.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .errors import CuvilError
from .fsutil import atomic_write
from .ir.core import Function, Module, Value

_COLORS = {"input": "#c8e6c9", "output": "#c8e6c9", "constant": "#eeeeee", "alias": "#fff9c4", "op": "#bbdefb"}
_LABEL_MAX = 60  # characters per label line


def _quote(text: str) -> str:
    """A DOT string: quotes and backslashes escaped, newlines as centred line breaks."""
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + text.replace("\n", "\\n") + '"'


def _short(text: str) -> str:
    return text if len(text) <= _LABEL_MAX else text[:_LABEL_MAX - 3] + "..."


def _plan(plan) -> str:
    if not isinstance(plan, dict):
        return str(plan)
    return ", ".join(f"{k}={plan[k]}" for k in ("form", "weights", "lanes") if k in plan)


def _label(op, index: int) -> list[str]:
    lines = [f"op{index}: {op.name.removeprefix('cuvil.')}"]
    if op.name == "cuvil.constant":
        lines[0] += f" {op.attrs.get('name', '')}"
    lines += [_short(str(r.type)) for r in op.results]
    post = op.attrs.get("post")
    if post:
        lines.append(_short("fused: " + " -> ".join(str(p[0]) for p in post)))
    if op.attrs.get("kernel_plan") is not None and op.name != "cuvil.constant":
        lines.append(_short("kernel: " + _plan(op.attrs["kernel_plan"])))
    if "arena_offset" in op.attrs:
        lines.append(f"arena @{op.attrs['arena_offset']}" + (" (alias)" if op.attrs.get("alias") else ""))
    if op.regions:
        lines.append(f"{len(op.regions)} region(s)")
    if op.loc:
        lines.append(_short(op.loc))
    return lines


def node_ids(fn: Function) -> dict[int, str]:
    """id(defining op or block argument value) -> its node name."""
    ids = {id(a): f"arg{k}" for k, a in enumerate(fn.args)}
    ids.update({id(op): f"op{i}" for i, op in enumerate(fn.body.ops)})
    return ids


def _source(v: Value, ids: dict[int, str]) -> str:
    return ids[id(v.defining_op)] if v.defining_op is not None else ids[id(v)]


def to_dot(module: Module, title: str = "main") -> str:
    """The DOT text of `module.main` (see the module docstring)."""
    fn = module.main
    ids = node_ids(fn)
    lines = ["digraph cuvil {", f"  graph [label={_quote(title)}, labelloc=t, rankdir=TB, fontname=Helvetica];",
             '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=10];',
             "  edge [fontname=Helvetica, fontsize=8, color=\"#555555\"];"]
    for k, (name, a) in enumerate(zip(fn.input_names, fn.args)):
        lines.append(f"  arg{k} [label={_quote(f'input {name}' + chr(10) + str(a.type))}, "
                     f"fillcolor=\"{_COLORS['input']}\", shape=oval];")
    for i, op in enumerate(fn.body.ops):
        kind = ("output" if op.name == "cuvil.return" else "constant" if op.name == "cuvil.constant"
                else "alias" if op.attrs.get("alias") else "op")
        label = _label(op, i)
        if kind == "output":
            label = ["outputs: " + ", ".join(fn.output_names)] if fn.output_names else ["return"]
        extra = ", fontsize=8" if kind == "constant" else ", shape=oval" if kind == "output" else ""
        lines.append(f"  op{i} [label={_quote(chr(10).join(label))}, fillcolor=\"{_COLORS[kind]}\"{extra}];")
    for i, op in enumerate(fn.body.ops):
        for v in op.operands:
            lines.append(f"  {_source(v, ids)} -> op{i} [label={_quote(_short(str(v.type)))}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def dot_command() -> str:
    """The path of Graphviz's `dot`, or CuvilError saying how to install it."""
    dot = shutil.which("dot")
    if dot is None:
        raise CuvilError("drawing the graph needs Graphviz's `dot`: install the Debian package graphviz "
                         "(`make setup` does) or Graphviz from https://graphviz.org")
    return dot


def write_graph(module: Module, path: str | Path, title: str = "main") -> Path:
    """Lay out `module.main` with `dot` and write it to `path`: SVG, or DOT text for a
    `.dot`/`.gv` path (any other format `dot -T` knows by the suffix, e.g. `.png`)."""
    path = Path(path)
    text = to_dot(module, title)
    fmt = path.suffix.lstrip(".").lower() or "svg"
    if fmt in ("dot", "gv"):
        atomic_write(path, text)
        return path
    proc = subprocess.run([dot_command(), f"-T{fmt}"], input=text.encode(), capture_output=True, timeout=600)
    if proc.returncode != 0:
        raise CuvilError(f"dot -T{fmt} failed for {path}: {proc.stderr.decode(errors='replace').strip()}")
    atomic_write(path, proc.stdout)
    return path
