"""IR text form. `parser.parse_module(print_module(m))` prints back identically.

    func @main(%0: tensor<[1, 8], f32> "x") -> ("logits") {
      %1 = cuvil.constant() {name = "fc.weight"} : tensor<[8, 4], f32>
      %2 = cuvil.matmul(%0, %1) {} : tensor<[1, 4], f32> loc("model.py:12 in forward")
      cuvil.return(%2)
    }
"""
from __future__ import annotations

import json
import math

from .core import Function, Module


def format_attr(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_attr(v) for v in value) + "]"
    if isinstance(value, dict):
        return format_attrs(value)
    raise TypeError(f"cannot print attribute value {value!r}")


def format_attrs(attrs: dict) -> str:
    return "{" + ", ".join(f"{k} = {format_attr(attrs[k])}" for k in sorted(attrs)) + "}"


def print_function(fn: Function, indent: str = "") -> str:
    """fn's text; a control-flow op's regions follow it, nested in `regions { ... }`
    (each a function of its own: its values are numbered from %0 again)."""
    names: dict[int, str] = {}

    def name(v) -> str:
        if id(v) not in names:
            names[id(v)] = f"%{len(names)}"
        return names[id(v)]

    args = ", ".join(f"{name(a)}: {a.type} {json.dumps(n)}" for a, n in zip(fn.args, fn.input_names))
    outs = ", ".join(json.dumps(n) for n in fn.output_names)
    fattrs = f" attributes {format_attrs(fn.attrs)}" if fn.attrs else ""
    lines = [f"{indent}func @{fn.name}({args}) -> ({outs}){fattrs} {{"]
    for op in fn.body.ops:
        operands = ", ".join(name(v) for v in op.operands)
        if op.name == "cuvil.return":
            lines.append(f"{indent}  cuvil.return({operands})")
            continue
        results = ", ".join(name(r) for r in op.results)
        types = ", ".join(str(r.type) for r in op.results)
        loc = f" loc({json.dumps(op.loc)})" if op.loc else ""
        opened = " regions {" if op.regions else ""
        lines.append(f"{indent}  {results} = {op.name}({operands}) {format_attrs(op.attrs)} : {types}{loc}{opened}")
        if op.regions:
            lines += [print_function(region, indent + "    ") for region in op.regions]
            lines.append(f"{indent}  }}")
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def print_module(module: Module) -> str:
    return "\n\n".join(print_function(f) for f in module.functions.values()) + "\n"
