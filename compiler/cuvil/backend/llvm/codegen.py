"""Cuvil IR (after the pipeline, memory-planned) -> one LLVM module.

The module defines `<prefix>_forward(i8** inputs, i8** outputs, i8* arena)`, which calls
one kernel function per op in program order. A module with symbolic dims takes a fourth
argument, `i64* dims`: the symbols' values for this run (in `Generated.symbols` order),
passed on to every kernel whose types have symbolic dims (symbolic.py). Kernels are
specialised to their (possibly symbolic) shapes and shared between ops with the same
signature (ResNet's repeated blocks reuse code). Weights
live in a separate blob (`<prefix>_weights`, see weights.py) addressed by offset; scalar
constants are folded into the kernels that use them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir

from ...errors import BackendError
from ...ir import Module, Value
from ...ir import symdim
from ...ir.ops import ELEMENTWISE
from ...ir.ops.dynamic import produced_symbols
from ...ir.printer import format_attrs
from ...ir.types import TensorType
from .emit import I64, MEM_TYPES, PTR, emit_memcpy, i64
from .gemm import pack_b
from .control import emit_control
from .kernel_args import KernelArgs
from .kernels import bf16, fuse_pw_dw, quantized
from .kernels.conv_shapes import conv_weights_packed
from .kernels.custom import emit_custom
from .kernels.data import k_copy
from .kernels.registry import EMITTERS
from .kernels.schemes import quantized_weight
from .kernels.winograd import winograd_weights
from .select import KernelTarget, inlinable, inlined_consts, kernel_attrs, plan_of
from .symbolic import FnSizes, KType, Size, SymbolicDecision, body_block, emitting
from .weights import WEIGHTS_ALIGN, declare_weights

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
    # Symbolic dims: (name, lo, hi) in the order of forward's `dims` argument.
    symbols: list = field(default_factory=list)
    # With profiling: one (op name, source location, result type) per timed kernel call;
    # the object then exports `<prefix>_profile`, an i64 cycle counter per call.
    profile_ops: list = field(default_factory=list)


def _align(n: int, a: int = WEIGHTS_ALIGN) -> int:
    return -(-n // a) * a


class _Codegen:
    def __init__(self, module: Module, prefix: str, target: KernelTarget, profile: bool = False, specialize=()):
        self.profile = profile
        self.specializations = [dict(s) for s in specialize]
        self.profile_ops: list = []
        self.vw = target.lanes
        self.int8 = target.int8
        self.bf16 = target.bf16
        self.module = module
        self.fn = module.main
        self.prefix = prefix
        self.regions: dict[tuple, ir.Function] = {}  # (region id, specialisation) -> its function
        self.region_names = 0
        self.wsym = None
        self.mod = ir.Module(name=prefix)
        self.kernels: dict[str, ir.Function] = {}
        self.weight_offsets: dict[int, int] = {}
        self.blob = bytearray()
        self.bounds = {k: tuple(v) for k, v in (self.fn.attrs.get("dim_bounds") or {}).items()}
        self.symbols = symbol_order(module, self.bounds)
        self.fixed: dict[str, int] = {}  # the specialisation being emitted (symbol -> value)
        # set by generate from the kernel plans (static shapes only, so the same for every
        # specialisation): id(depthwise conv) -> the 1x1 conv it runs fused with
        self.fused: dict[int, object] = {}

    # -- symbolic dims, as seen by the forward being emitted ----------------------------------
    def _dim(self, d):
        return Size.of(symdim.bind(d, self.fixed), self.bounds)

    def _ktype(self, t) -> KType:
        return KType(tuple(self._dim(d) for d in t.shape), t.dtype, t.layout)

    def _op_symbols(self, op) -> set[str]:
        """The symbols of op's types and dim attributes left once the specialisation binds its own."""
        dims = [d for v in [*op.results, *op.operands] for d in v.type.shape]
        dims += [d for key in type(op).dim_attrs for d in op.attrs.get(key) or []]
        return set().union(set(), *(symdim.symbols(symdim.bind(d, self.fixed)) for d in dims if isinstance(d, str)))

    @staticmethod
    def _packs_b(op) -> bool:
        """Its kernel plan stores operand 1 transformed (panels, Winograd)."""
        return "weights" in plan_of(op)

    def _add_blob(self, key, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array)
        data = data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes()
        self.blob += b"\0" * (_align(len(self.blob)) - len(self.blob))
        self.weight_offsets[key] = len(self.blob)
        self.blob += data

    def layout_weights(self):
        every = [op for fn in self.module.all_functions() for op in fn.body.ops]
        for op in every:
            if op.name != "cuvil.constant":
                continue
            uses = [(u, i) for u in op.result.uses for i, v in enumerate(u.operands) if v is op.result]
            packers = [u for u, i in uses if i == 1 and self._packs_b(u)]
            if packers:  # a matmul's B or a conv's weight
                layout = plan_of(packers[0])["weights"]
                if layout == "panels":
                    packed = pack_b(op.value, self.vw)
                elif layout == "winograd":
                    packed = winograd_weights(op.value)
                else:
                    packed = conv_weights_packed(op.value, self.vw)
                self._add_blob((id(op.result), "packed"), packed)
            if any(not inlinable(u, i) and not (i == 1 and self._packs_b(u)) and u.name != "cuvil.dequantize"
                   for u, i in uses):
                self._add_blob(id(op.result), op.value)
        for op in every:  # int4 weights, in the layout their kernels read (kernels/quantized.py)
            if op.name == "cuvil.dequantize":
                self._add_blob(id(op.result), quantized.quantized_blob(op, plan_of(op)["layout"], self.vw, self.int8))
        self.blob += b"\0" * (_align(max(len(self.blob), 1)) - len(self.blob))

    def _signature(self, op, aliased: bool):
        """(cache key, attrs, inlined constants, emitter) of op's kernel."""
        consts = inlined_consts(op)
        attrs = kernel_attrs(op)
        plan = plan_of(op)
        for key in ("out_pairs", "in_pairs", "pairs_extras"):  # plane pairs (select.SelectStorage)
            if key in plan:
                attrs[key] = plan[key]
        packed = self._packs_b(op)
        q4 = quantized_weight(op)
        bound = sorted((k, v) for k, v in self.fixed.items() if k in op_types_symbols(op))
        key = "|".join([op.name, format_attrs(attrs), str(op.result.type),
                        ",".join(str(v.type) for v in op.operands), repr(sorted(consts.items())), str(aliased),
                        str(packed), str(q4), repr(bound), format_attrs(plan)])
        emitter = k_copy if op.name == "cuvil.reshape" else EMITTERS.get(op.name)
        if op.name == "cuvil.custom":  # a call to a plugin's C function (custom.py)
            emitter = emit_custom
        if q4:
            emitter = quantized.EMITTERS[op.name]
        if op.name in ELEMENTWISE:  # a bare elementwise op (fusion turned off): a one-step program
            attrs = {"program": [[op.name.split(".", 1)[1], list(range(len(op.operands))), attrs]]}
            emitter = EMITTERS["cuvil.fused"]
        if emitter is None:
            raise BackendError(f"no kernel for {op.name}" + (f" ({op.loc})" if op.loc else ""))
        if op_types_symbols(op) or op_is_symbolic(op):  # dim attributes (reshape's shape, slice's ends)
            attrs = {k: ([self._dim(d) for d in v] if k in type(op).dim_attrs else v) for k, v in attrs.items()}
        return key, attrs, consts, emitter

    def _function(self, op, n_args: int, aliased: bool, symbolic: bool):
        """A kernel function of n_args pointers (and the dims with `symbolic`), its builder."""
        params = [PTR] * n_args + ([I64.as_pointer()] if symbolic else [])
        f = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), params),
                        name=f"{self.prefix}_k{len(self.kernels)}_{op.name.split('.')[1]}")
        f.linkage = "internal"
        f.attributes.add("noinline")
        f.attributes.add("nounwind")
        for a in f.args[:n_args]:
            if not aliased:
                a.add_attribute("noalias")
        b = ir.IRBuilder(f.append_basic_block("entry"))
        if symbolic:
            body_block(b)
        return f, b

    def _emit(self, op, f, b, emitter, args) -> None:
        try:
            with emitting(FnSizes(f, args.dims, self.symbols)):
                emitter(b, args)
        except BackendError:
            raise
        except SymbolicDecision as e:
            raise BackendError(f"{op.name}" + (f" ({op.loc})" if op.loc else "") + " does not support these "
                               f"symbolic shapes yet ({e}); give static shapes or other bounds") from e
        except Exception as e:
            raise BackendError(f"code generation failed for {op.name}"
                               + (f" ({op.loc})" if op.loc else "") + f": {type(e).__name__}: {e}") from e
        b.ret_void()

    def kernel(self, op, aliased: bool) -> ir.Function:
        key, attrs, consts, emitter = self._signature(op, aliased)
        if key in self.kernels:
            return self.kernels[key]
        symbolic = bool(self._op_symbols(op))
        n_args = 2 + len(op.operands)  # result, operands, scratch
        f, b = self._function(op, n_args, aliased, symbolic)
        dims = f.args[n_args] if symbolic else None
        types = [self._ktype(t) for t in [op.result.type] + [v.type for v in op.operands]]
        if attrs.get("out_pairs") and bf16.passes_pairs(op):  # it runs on the pairs as they are
            types, attrs = bf16.pairs_view(op.name, types, attrs)
        typed = [b.bitcast(a, MEM_TYPES[t.dtype].as_pointer()) for a, t in zip(f.args[:n_args - 1], types)]
        args = KernelArgs(out=typed[0], out_type=types[0],
                          ins=[None if i in consts else p for i, p in enumerate(typed[1:])],
                          in_types=types[1:], attrs=dict(attrs), consts=consts,
                          vw=self.vw, scratch=f.args[n_args - 1], dims=dims,
                          symbols=self.symbols, int8=self.int8, bf16=self.bf16, plan=plan_of(op))
        self._emit(op, f, b, emitter, args)
        self.kernels[key] = f
        return f

    def fused_producer(self, op):
        """The 1x1 conv that op (a depthwise conv) runs fused with (its plan's form
        "fused_depthwise"), or None."""
        if plan_of(op).get("form") != "fused_depthwise":
            return None
        a = op.operands[0].defining_op
        if "scratch_offset" not in op.attrs:
            raise BackendError(f"{op.name}" + (f" ({op.loc})" if op.loc else "") + " runs fused but has no scratch: "
                               "plan memory after kernel selection")
        # the memory plan keeps the 1x1 conv's operands alive until op (`reads_producer`):
        # op's scratch and result never take their bytes
        written = [(op.attrs["scratch_offset"], op.attrs["scratch_bytes"])]
        if "arena_offset" in op.attrs:
            written.append((op.attrs["arena_offset"], self._ktype(op.result.type).nbytes))
        for v in a.operands:
            at = v.defining_op.attrs.get("arena_offset") if v.defining_op is not None else None
            if at is not None and any(at < lo + n and lo < at + self._ktype(v.type).nbytes for lo, n in written):
                raise BackendError(f"{op.name}" + (f" ({op.loc})" if op.loc else "") + " runs fused, but its memory "
                                   "plan overwrites the 1x1 conv's operands: plan memory after kernel selection")
        return a

    def _own_args(self, op, sig=None) -> KernelArgs:
        """op's KernelArgs as far as its types, attrs and constants go (no pointers)."""
        _, attrs, consts, _ = sig or self._signature(op, False)
        return KernelArgs(out=None, out_type=self._ktype(op.result.type), ins=[None] * len(op.operands),
                          in_types=[self._ktype(v.type) for v in op.operands], attrs=dict(attrs), consts=consts,
                          vw=self.vw, plan=plan_of(op))

    def fused_kernel(self, a, dw) -> ir.Function:
        """The kernel of the 1x1 conv `a` fused into the depthwise conv `dw`: arguments
        dw's result, a's operands, dw's operands from 1, the scratch."""
        sigs = [self._signature(op, False) for op in (a, dw)]
        key = "fused|" + "|".join(s[0] for s in sigs)
        if key in self.kernels:
            return self.kernels[key]
        operands = [*a.operands, *dw.operands[1:]]
        n_args = 2 + len(operands)
        f, b = self._function(dw, n_args, False, False)
        types = [self._ktype(v.type) for v in [dw.result, *operands]]
        typed = [b.bitcast(p, MEM_TYPES[t.dtype].as_pointer()) for p, t in zip(f.args[:n_args - 1], types)]
        na = len(a.operands)
        nulls = set(sigs[0][2]) | {na - 1 + i for i in sigs[1][2]}
        args = KernelArgs(out=typed[0], out_type=types[0],
                          ins=[None if i in nulls else p for i, p in enumerate(typed[1:])], in_types=types[1:],
                          attrs={}, vw=self.vw, scratch=f.args[n_args - 1], symbols=self.symbols, int8=self.int8,
                          bf16=self.bf16)
        own = [self._own_args(op, sig) for op, sig in zip((a, dw), sigs)]
        self._emit(dw, f, b, lambda bb, k: fuse_pw_dw.emit(bb, k, a, dw, own[0], own[1], sigs[0][3]), args)
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
        for op in [op for f in self.module.all_functions() for op in f.body.ops]:
            a = self.fused_producer(op) if op.name == "cuvil.conv2d" else None
            if a is not None:
                self.fused[id(op)] = a
        wsym = self.wsym = declare_weights(self.mod, f"{self.prefix}_weights", len(self.blob))
        if not self.specializations:
            self._forward(f"{self.prefix}_forward", fn, wsym)
        else:  # the general forward, one per specialisation, and a dispatcher
            general = self._forward(f"{self.prefix}_forward_any", fn, wsym, internal=True)
            variants = []
            for env in self.specializations:
                self.fixed = dict(env)
                variants.append((env, self._forward(f"{self.prefix}_forward_s{len(variants)}", fn, wsym,
                                                    internal=True)))
            self.fixed = {}
            self._dispatcher(general, variants)
        self.serial_parallel_for()
        outs = fn.outputs
        return Generated(llvm_ir=str(self.mod), weights=bytes(self.blob), prefix=self.prefix,
                         arena_size=int(fn.attrs.get("arena_size", 0)),
                         inputs=list(zip(fn.input_names, [a.type for a in fn.args])),
                         outputs=list(zip(fn.output_names, [v.type for v in outs])),
                         kernels=len(self.kernels), profile_ops=self.profile_ops,
                         symbols=[(name, *self.bounds[name]) for name in self.symbols])

    def _forward(self, name, fn, wsym, internal: bool = False) -> ir.Function:
        params = [PTR.as_pointer(), PTR.as_pointer(), PTR] + ([I64.as_pointer()] if self.symbols else [])
        entry = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), params), name=name)
        entry.attributes.add("nounwind")
        if internal:
            entry.linkage = "internal"
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        inputs, outputs, arena = entry.args[:3]
        dims = entry.args[3] if self.symbols else None
        if dims is not None:
            body_block(b)
        with emitting(FnSizes(entry, dims, self.symbols)):
            self._forward_body(b, fn, wsym, inputs, outputs, arena, dims)
        return entry

    def region_function(self, region) -> ir.Function:
        """The internal function of a control-flow op's region (control.py), with the
        forward's signature, emitted once per specialisation."""
        key = (id(region), tuple(sorted(self.fixed.items())))
        if key not in self.regions:
            name = f"{self.prefix}_region{self.region_names}"
            self.region_names += 1  # before emitting: the region's own regions are numbered inside
            self.regions[key] = self._forward(name, region, self.wsym, internal=True)
        return self.regions[key]

    def _dispatcher(self, general, variants) -> None:
        """`<prefix>_forward`: the first specialisation whose values match this run's dims,
        else the general code."""
        params = [PTR.as_pointer(), PTR.as_pointer(), PTR, I64.as_pointer()]
        entry = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), params), name=f"{self.prefix}_forward")
        entry.attributes.add("nounwind")
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        args = list(entry.args)
        for env, fn in variants:
            match = ir.Constant(ir.IntType(1), 1)
            for name, value in sorted(env.items()):
                v = b.load(b.gep(args[3], [i64(self.symbols[name])], inbounds=True))
                match = b.and_(match, b.icmp_signed("==", v, i64(value)))
            with b.if_then(match):
                b.call(fn, args)
                b.ret_void()
        b.call(general, args)
        b.ret_void()

    def _forward_body(self, b, fn, wsym, inputs, outputs, arena, dims):
        wbase = b.bitcast(wsym, PTR)
        loc: dict[int, ir.Value] = {}
        for i, a in enumerate(fn.args):
            loc[id(a)] = b.load(b.gep(inputs, [i64(i)]), name=f"in{i}")
        outs = fn.outputs
        direct: dict[int, int] = {}  # value id -> output index written in place
        for j, v in enumerate(outs):
            op = v.defining_op
            if op is not None and op.name != "cuvil.constant" and id(v) not in direct \
                    and not op.attrs.get("alias") and not op.regions:
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
            elif op.regions:  # a control-flow op's results: one buffer each
                p = b.gep(arena, [i64(op.attrs["arena_offsets"][v.index])], inbounds=True)
            else:
                if "arena_offset" not in op.attrs:
                    raise BackendError(f"{op.name} has no arena_offset: run the memory-plan pass first")
                p = b.gep(arena, [i64(op.attrs["arena_offset"])], inbounds=True)
            loc[id(v)] = p
            return p

        def operand_ptrs(op):
            packed = self._packs_b(op)
            return [None if inlinable(op, i) else
                    b.gep(wbase, [i64(self.weight_offsets[(id(v), "packed")])], inbounds=True) if packed and i == 1
                    else where(v) for i, v in enumerate(op.operands)]

        absorbed = {id(a) for a in self.fused.values()}
        for op in fn.body.ops:
            if op.name in ("cuvil.constant", "cuvil.dequantize", "cuvil.return") or op.attrs.get("alias") \
                    or id(op) in absorbed:
                continue
            if op.regions:
                emit_control(self, b, op, [where(v) for v in op.operands], [where(r) for r in op.results], arena,
                             dims)
                continue
            if len(op.results) != 1:
                raise BackendError(f"{op.name}: multi-result ops are not supported by the backend")
            a = self.fused.get(id(op))
            ptrs = [where(op.result)] + (operand_ptrs(op) if a is None else operand_ptrs(a) + operand_ptrs(op)[1:])
            real = [p for p in ptrs if p is not None]
            aliased = len({id(p) for p in real}) < len(real) or op.name == "cuvil.fused"
            planned = op.attrs.get("arena_offset")
            if op.name == "cuvil.conv2d" and planned is not None and not plan_of(op).get("in_place") and any(
                    v.defining_op is not None and v.defining_op.attrs.get("arena_offset") == planned
                    for v in op.operands[2:]):
                raise BackendError(f"{op.name}" + (f" ({op.loc})" if op.loc else "") + " was planned to write over its "
                                   f"residual, which its kernel at {self.vw * 32}-bit vectors cannot: plan memory "
                                   "for this target (select.SelectKernels before the memory plan)")
            if plan_of(op).get("scratch") and "scratch_offset" not in op.attrs:
                raise BackendError(f"{op.name} needs {plan_of(op)['scratch']} bytes of scratch but has no "
                                   "scratch_offset: plan memory with the backend's scratch sizes")
            kern = self.kernel(op, aliased) if a is None else self.fused_kernel(a, op)
            scratch = (b.gep(arena, [i64(op.attrs["scratch_offset"])], inbounds=True)
                       if "scratch_offset" in op.attrs else ir.Constant(PTR, None))
            args = [p if p is not None else ir.Constant(PTR, None) for p in ptrs] + [scratch]
            if self._op_symbols(op):
                args.append(dims)
            if self.profile:
                self.timed_call(b, kern, args, op)
            else:
                b.call(kern, args)
        # Outputs not written in place (inputs, constants, duplicates, aliases) are copied.
        for j, v in enumerate(outs):
            if direct.get(id(v)) == j:
                continue
            emit_memcpy(b, out_ptrs[j], where(v), self._ktype(v.type).nbytes)
        b.ret_void()


def op_types_symbols(op) -> set[str]:
    return set().union(*(v.type.symbols for v in [*op.results, *op.operands]))


def op_is_symbolic(op) -> bool:
    """Its types or dim attributes have symbolic dims: its kernel takes the dims argument."""
    return any(not v.type.is_static for v in [*op.results, *op.operands]) or any(
        isinstance(d, str) for key in type(op).dim_attrs for d in op.attrs.get(key) or [])


def symbol_order(module: Module, bounds: dict) -> dict[str, int]:
    """The symbolic dims in the order of their first appearance in the inputs' shapes
    (the order of forward's `dims`), then the dims that ops produce (data-dependent sizes,
    which their kernels store into `dims`). Every input dim must be an int or a plain
    symbol with bounds, and every other symbol of the module must be produced."""
    fn = module.main
    order: dict[str, int] = {}
    for a, name in zip(fn.args, fn.input_names):
        for d in a.type.shape:
            if isinstance(d, str):
                if not symdim.parse(d) == {(d,): 1}:
                    raise BackendError(f"input {name!r} has the dim {d!r}: input dims must be integers or "
                                       "plain symbols (batch, seq_len)")
                if d not in bounds:
                    raise BackendError(f"input {name!r}: the symbolic dim {d!r} has no bounds "
                                       "(give it [min, max])")
                order.setdefault(d, len(order))
    for region in module.all_functions():  # data-dependent sizes (ir/ops/dynamic.py) follow
        for op in region.body.ops:
            for name in produced_symbols(op):
                if name not in bounds:
                    raise BackendError(f"{op.name}: its produced dim {name!r} has no bounds")
                order.setdefault(name, len(order))
    for op in fn.body.ops:
        for v in op.results:
            missing = v.type.symbols - set(order)
            if missing:
                raise BackendError(f"{op.name}" + (f" ({op.loc})" if op.loc else "") +
                                   f" yields {v.type}: the symbol(s) {', '.join(sorted(missing))} are not "
                                   "dims of any input")
    return order


def generate(module: Module, prefix: str = "cuvil_model", profile: bool = False, specialize=()) -> Generated:
    """LLVM IR text and the weights blob for a module whose ops carry kernel plans
    (select.SelectKernels / SelectStorage for a target, then the memory plan): the code
    is for the target the plans were made for (`fn.attrs["kernel_target"]`).

    `specialize`: symbol -> value mappings (`[{"seq_len": 128}]`); for each, the forward
    is also generated with those dims fixed at compile time, and runs whose dims match
    take it (the first match; otherwise the general code)."""
    fn = module.main
    bounds = fn.attrs.get("dim_bounds") or {}
    for i, env in enumerate(specialize):
        for name, value in env.items():
            if name not in bounds:
                raise BackendError(f"specialize[{i}]: {name!r} is not a symbolic dim of the model "
                                   f"(its dims: {', '.join(sorted(bounds)) or 'none'})")
            lo, hi = bounds[name]
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise BackendError(f"specialize[{i}]: {name} = {value!r} is outside its bounds [{lo}, {hi}]")
    if specialize and profile:
        raise BackendError("profiling a model with specialisations is not supported")
    if profile and sum(op.name not in ("cuvil.constant", "cuvil.return") for op in fn.body.ops) > 4096:
        raise BackendError("profiling supports up to 4096 ops")
    return _Codegen(module, prefix, KernelTarget.recorded(fn), profile, specialize).generate()
