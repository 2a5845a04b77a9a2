"""What an emitter gets: KernelArgs, the typed pointers, types, attributes, inlined
constants, vector lanes, scratch, symbolic dims and kernel plan of one op's kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from llvmlite import ir

from ...ir.types import TensorType


@dataclass
class KernelArgs:
    out: ir.Value                       # typed pointer to the result
    out_type: TensorType
    ins: list[ir.Value | None]          # typed pointers (None: inlined scalar constant)
    in_types: list[TensorType]
    attrs: dict
    consts: dict[int, float] = field(default_factory=dict)  # operand index -> inlined scalar
    vw: int = 4                         # f32 lanes of the target's vector registers
    scratch: ir.Value | None = None     # i8* scratch memory (see scratch_bytes)
    dims: ir.Value | None = None        # i64* runtime values of the symbolic dims (symbolic.py)
    symbols: dict = field(default_factory=dict)  # symbol -> index into dims
    int8: object = None                 # target.DotIsa of the int8 kernels (None: generic)
    bf16: object = None                 # target.DotIsa of the bf16 kernels (None: generic)
    plan: dict = field(default_factory=dict)  # the op's kernel plan (select.py)
