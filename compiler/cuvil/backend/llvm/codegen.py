"""Cuvil IR (after the pipeline, memory-planned) -> one LLVM module.

The module defines `<prefix>_forward(i8** inputs, i8** outputs, i8* arena)`, which calls
one kernel function per op in program order. Kernels are specialised to static shapes and
shared between ops with the same signature (ResNet's repeated blocks reuse code). Weights
live in a separate blob (`<prefix>_weights`, see weights.py) addressed by offset; scalar
constants are folded into the kernels that use them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir

from ...errors import BackendError
from ...ir import Module, Value
from ...ir.ops import ANCHORS, ELEMENTWISE
from ...ir.interpreter import PLAN_ATTRS
from ...ir.printer import format_attrs
from ...ir.types import TensorType
from .emit import I8, I64, MEM_TYPES, PTR, i64
from .custom import emit_custom
from .kernels import EMITTERS, KernelArgs, k_copy, scratch_bytes
from .gemm import pack_b
from . import qkernels
from .weights import WEIGHTS_ALIGN, declare_weights

_PLAN_ATTRS = PLAN_ATTRS


@dataclass
class Generated:
    llvm_ir: str
    weights: bytes
    prefix: str
    arena_size: int
    inputs: list[tuple[str, TensorType]]
    outputs: list[tuple[str, TensorType]]
    kernels: int = 0
    stats: dict = field(default_factory=dict)
    # With profiling: one (op name, source location, result type) per timed kernel call;
    # the object then exports `<prefix>_profile`, an i64 cycle counter per call.
    profile_ops: list = field(default_factory=list)


def _align(n: int, a: int = WEIGHTS_ALIGN) -> int:
    return -(-n // a) * a


def _is_scalar_const(v: Value) -> bool:
    op = v.defining_op
    return op is not None and op.name == "cuvil.constant" and op.value.size == 1


def _inlinable(op, i: int) -> bool:
    """Operands that kernels take as immediates: scalars of fused programs / epilogues."""
    if op.name == "cuvil.fused" or op.name in ELEMENTWISE:
        return _is_scalar_const(op.operands[i])
    if op.name in ANCHORS and i >= 2:
        return _is_scalar_const(op.operands[i])
    return False


class _Codegen:
    def __init__(self, module: Module, prefix: str, vector_bits: int, profile: bool = False):
        self.profile = profile
        self.profile_ops: list = []
        self.vw = max(vector_bits // 32, 1)
        self.fn = module.main
        self.prefix = prefix
        self.mod = ir.Module(name=prefix)
        self.kernels: dict[str, ir.Function] = {}
        self.weight_offsets: dict[int, int] = {}
        self.blob = bytearray()

    def _packs_b(self, op) -> bool:
        """A matmul whose B is a constant 2-D f32 matrix: B is stored packed in panels."""
        if op.name != "cuvil.matmul":
            return False
        b_val = op.operands[1]
        d = b_val.defining_op
        return (d is not None and d.name == "cuvil.constant" and b_val.type.rank == 2
                and b_val.dtype == "f32" and op.result.dtype == "f32")

    def _add_blob(self, key, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array)
        data = data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes()
        self.blob += b"\0" * (_align(len(self.blob)) - len(self.blob))
        self.weight_offsets[key] = len(self.blob)
        self.blob += data

    def layout_weights(self):
        for op in self.fn.body.ops:
            if op.name != "cuvil.constant":
                continue
            uses = [(u, i) for u in op.result.uses for i, v in enumerate(u.operands) if v is op.result]
            if any(i == 1 and self._packs_b(u) for u, i in uses):
                self._add_blob((id(op.result), "packed"), pack_b(op.value, self.vw))
            if any(not _inlinable(u, i) and not (i == 1 and self._packs_b(u)) and u.name != "cuvil.dequantize"
                   for u, i in uses):
                self._add_blob(id(op.result), op.value)
        for op in self.fn.body.ops:  # int4 weights, in the layout their kernels read (qkernels.py)
            if op.name == "cuvil.dequantize":
                self._add_blob(id(op.result), qkernels.quantized_blob(op, self.vw))
        self.blob += b"\0" * (_align(max(len(self.blob), 1)) - len(self.blob))

    def kernel(self, op, aliased: bool) -> ir.Function:
        consts = {i: op.operands[i].defining_op.value.reshape(()).item()
                  for i in range(len(op.operands)) if _inlinable(op, i)}
        attrs = {k: v for k, v in op.attrs.items() if k not in _PLAN_ATTRS}
        packed = self._packs_b(op)
        q4 = qkernels.quantized_weight(op)
        key = "|".join([op.name, format_attrs(attrs), str(op.result.type),
                        ",".join(str(v.type) for v in op.operands), repr(sorted(consts.items())), str(aliased),
                        str(packed), str(q4)])
        if key in self.kernels:
            return self.kernels[key]
        emitter = k_copy if op.name == "cuvil.reshape" else EMITTERS.get(op.name)
        if op.name == "cuvil.custom":  # a call to a plugin's C function (custom.py)
            emitter = emit_custom
        if q4:
            emitter = qkernels.EMITTERS[op.name]
        if op.name in ELEMENTWISE:  # a bare elementwise op (fusion turned off): a one-step program
            attrs = {"program": [[op.name.split(".", 1)[1], list(range(len(op.operands))), attrs]]}
            emitter = EMITTERS["cuvil.fused"]
        if emitter is None:
            raise BackendError(f"no kernel for {op.name}" + (f" ({op.loc})" if op.loc else ""))
        n_args = 2 + len(op.operands)  # result, operands, scratch
        f = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), [PTR] * n_args),
                        name=f"{self.prefix}_k{len(self.kernels)}_{op.name.split('.')[1]}")
        f.linkage = "internal"
        f.attributes.add("noinline")
        f.attributes.add("nounwind")
        for a in f.args:
            if not aliased:
                a.add_attribute("noalias")
        b = ir.IRBuilder(f.append_basic_block("entry"))
        typed = [b.bitcast(a, MEM_TYPES[t.dtype].as_pointer())
                 for a, t in zip(f.args[:-1], [op.result.type] + [v.type for v in op.operands])]
        args = KernelArgs(out=typed[0], out_type=op.result.type,
                          ins=[None if i in consts else p for i, p in enumerate(typed[1:])],
                          in_types=[v.type for v in op.operands], attrs=dict(attrs), consts=consts,
                          vw=self.vw, scratch=f.args[-1], packed_b=packed)
        try:
            emitter(b, args)
        except BackendError:
            raise
        except Exception as e:
            raise BackendError(f"code generation failed for {op.name}"
                               + (f" ({op.loc})" if op.loc else "") + f": {type(e).__name__}: {e}") from e
        b.ret_void()
        self.kernels[key] = f
        return f

    def timed_call(self, b, kern, args, op):
        """Call a kernel between two cycle-counter reads; add the difference to its slot."""
        clock = self.mod.globals.get("llvm.readcyclecounter") or ir.Function(
            self.mod, ir.FunctionType(I64, []), name="llvm.readcyclecounter")
        slot = len(self.profile_ops)
        self.profile_ops.append((op.name, op.loc, str(op.result.type)))
        t0 = b.call(clock, [])
        b.call(kern, args)
        t1 = b.call(clock, [])
        cell = b.gep(self._profile_global(), [i64(0), i64(slot)], inbounds=True)
        b.store(b.add(b.load(cell), b.sub(t1, t0)), cell)

    def _profile_global(self):
        gv = self.mod.globals.get(f"{self.prefix}_profile")
        if gv is None:
            gv = ir.GlobalVariable(self.mod, ir.ArrayType(I64, 4096), name=f"{self.prefix}_profile")
            gv.initializer = ir.Constant(ir.ArrayType(I64, 4096), None)
        return gv

    def serial_parallel_for(self):
        """A weak, serial `cuvil_parallel_for` so the object also links without the
        runtime; the runtime's thread pool (a strong definition) replaces it."""
        fn = self.mod.globals.get("cuvil_parallel_for")
        if fn is None:
            return
        fn.linkage = "weak"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        task, ctx, n = fn.args
        b.call(task, [ctx, i64(0), n])
        b.ret_void()

    def generate(self) -> Generated:
        fn = self.fn
        self.layout_weights()
        wsym = declare_weights(self.mod, f"{self.prefix}_weights", len(self.blob))
        entry = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), [PTR.as_pointer(), PTR.as_pointer(), PTR]),
                            name=f"{self.prefix}_forward")
        entry.attributes.add("nounwind")
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        inputs, outputs, arena = entry.args
        wbase = b.bitcast(wsym, PTR)
        loc: dict[int, ir.Value] = {}
        for i, a in enumerate(fn.args):
            loc[id(a)] = b.load(b.gep(inputs, [i64(i)]), name=f"in{i}")
        outs = fn.outputs
        direct: dict[int, int] = {}  # value id -> output index written in place
        for j, v in enumerate(outs):
            op = v.defining_op
            if op is not None and op.name != "cuvil.constant" and id(v) not in direct \
                    and not op.attrs.get("alias"):
                direct[id(v)] = j
        out_ptrs = [b.load(b.gep(outputs, [i64(j)]), name=f"out{j}") for j in range(len(outs))]

        def where(v: Value) -> ir.Value:
            if id(v) in loc:
                return loc[id(v)]
            op = v.defining_op
            if op.name in ("cuvil.constant", "cuvil.dequantize"):
                p = b.gep(wbase, [i64(self.weight_offsets[id(v)])], inbounds=True)
            elif id(v) in direct:
                p = out_ptrs[direct[id(v)]]
            elif op.attrs.get("alias"):
                p = where(op.operands[0])
            else:
                if "arena_offset" not in op.attrs:
                    raise BackendError(f"{op.name} has no arena_offset: run the memory-plan pass first")
                p = b.gep(arena, [i64(op.attrs["arena_offset"])], inbounds=True)
            loc[id(v)] = p
            return p

        for op in fn.body.ops:
            if op.name in ("cuvil.constant", "cuvil.dequantize", "cuvil.return") or op.attrs.get("alias"):
                continue
            if len(op.results) != 1:
                raise BackendError(f"{op.name}: multi-result ops are not supported by the backend")
            packed = self._packs_b(op)
            ptrs = [where(op.result)] + [
                None if _inlinable(op, i) else
                b.gep(wbase, [i64(self.weight_offsets[(id(v), "packed")])], inbounds=True) if packed and i == 1
                else where(v) for i, v in enumerate(op.operands)]
            real = [p for p in ptrs if p is not None]
            aliased = len({id(p) for p in real}) < len(real) or op.name == "cuvil.fused"
            if scratch_bytes(op) and "scratch_offset" not in op.attrs:
                raise BackendError(f"{op.name} needs {scratch_bytes(op)} bytes of scratch but has no "
                                   "scratch_offset: plan memory with the backend's scratch sizes")
            kern = self.kernel(op, aliased)
            scratch = (b.gep(arena, [i64(op.attrs["scratch_offset"])], inbounds=True)
                       if "scratch_offset" in op.attrs else ir.Constant(PTR, None))
            args = [p if p is not None else ir.Constant(PTR, None) for p in ptrs] + [scratch]
            if self.profile:
                self.timed_call(b, kern, args, op)
            else:
                b.call(kern, args)
        # Outputs not written in place (inputs, constants, duplicates, aliases) are copied.
        for j, v in enumerate(outs):
            if direct.get(id(v)) == j:
                continue
            n = v.type.nbytes
            memcpy = self.mod.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
            b.call(memcpy, [out_ptrs[j], where(v), i64(n), ir.Constant(ir.IntType(1), 0)])
        b.ret_void()
        self.serial_parallel_for()
        return Generated(llvm_ir=str(self.mod), weights=bytes(self.blob), prefix=self.prefix,
                         arena_size=int(fn.attrs.get("arena_size", 0)),
                         inputs=list(zip(fn.input_names, [a.type for a in fn.args])),
                         outputs=list(zip(fn.output_names, [v.type for v in outs])),
                         kernels=len(self.kernels), profile_ops=self.profile_ops)


def generate(module: Module, prefix: str = "cuvil_model", vector_bits: int = 128,
             profile: bool = False) -> Generated:
    """LLVM IR text and the weights blob for a planned module."""
    for a in module.main.args:
        if not a.type.is_static:
            raise BackendError(f"input has symbolic dims {a.type}: compile needs static shapes")
    if profile and sum(op.name not in ("cuvil.constant", "cuvil.return") for op in module.main.body.ops) > 4096:
        raise BackendError("profiling supports up to 4096 ops")
    return _Codegen(module, prefix, vector_bits, profile).generate()
