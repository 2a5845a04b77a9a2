"""Control-flow ops (ir/ops/control.py) in a forward: each region is an internal function
with the forward's own signature (`inputs`, `outputs`, `arena`[, `dims`]), called from a
branch or a loop. The memory plan gave the op's results arena buffers of their own
(`arena_offsets`) and its scratch the regions' arena (at its start) and, for a loop, the
predicate and the next carried values (`loop_offsets`).

A while loop copies its initial values into its result buffers, then runs
`cond(results, invariants) -> predicate` and, while that holds,
`body(results, invariants) -> next values` followed by a copy of the next values into the
result buffers: the body never writes a buffer it is still reading.
"""
from __future__ import annotations

from llvmlite import ir

from ...errors import BackendError
from .emit import F16, F32, F64, MEM_TYPES, PTR, emit_memcpy, i64


def pointer_array(b: ir.IRBuilder, ptrs: list) -> ir.Value:
    """An `i8**` to a stack array holding ptrs (allocated where b is: straight-line code
    of the forward, never inside a loop it emits)."""
    arr = b.alloca(ir.ArrayType(PTR, max(len(ptrs), 1)))
    for i, p in enumerate(ptrs):
        b.store(b.bitcast(p, PTR), b.gep(arr, [i64(0), i64(i)], inbounds=True))
    return b.bitcast(arr, PTR.as_pointer())


def truth(b: ir.IRBuilder, ptr: ir.Value, dtype: str) -> ir.Value:
    """The first element of a predicate tensor, as an i1 (non-zero is true)."""
    ty = MEM_TYPES[dtype]
    v = b.load(b.bitcast(ptr, ty.as_pointer()))
    if ty in (F32, F64, F16):
        return b.fcmp_unordered("!=", v, ir.Constant(ty, 0.0))
    return b.icmp_unsigned("!=", v, ir.Constant(ty, 0))


def emit_control(cg, b: ir.IRBuilder, op, ptrs: list, results: list, arena: ir.Value, dims) -> None:
    """Emit op (cuvil.if / cuvil.while) at b: ptrs are its operands' pointers, results its
    result buffers; `cg` is the codegen (region functions, sizes)."""
    if "scratch_offset" in op.attrs:
        scratch = b.gep(arena, [i64(op.attrs["scratch_offset"])], inbounds=True)
    else:
        scratch = ir.Constant(PTR, None)
    extra = [dims] if dims is not None else []
    regions = [cg.region_function(r) for r in op.regions]
    if op.name == "cuvil.if":
        pred = truth(b, ptrs[0], op.operands[0].dtype)
        args = [pointer_array(b, ptrs[1:]), pointer_array(b, results), scratch] + extra
        with b.if_else(pred) as (then, otherwise):
            with then:
                b.call(regions[0], args)
            with otherwise:
                b.call(regions[1], args)
        return
    if op.name != "cuvil.while":
        raise BackendError(f"no code generation for {op.name}")
    n = int(op.attrs.get("carried", len(op.operands)))
    sizes = [cg._ktype(r.type).nbytes for r in op.results]
    for dst, src, size in zip(results, ptrs[:n], sizes):
        emit_memcpy(b, dst, src, size)
    pred_at, *next_at = op.attrs["loop_offsets"]
    pred = b.gep(scratch, [i64(pred_at)], inbounds=True)
    nexts = [b.gep(scratch, [i64(o)], inbounds=True) for o in next_at]
    ins = pointer_array(b, results + ptrs[n:])
    cond_outs, body_outs = pointer_array(b, [pred]), pointer_array(b, nexts)
    head = b.append_basic_block("while.cond")
    body = b.append_basic_block("while.body")
    done = b.append_basic_block("while.end")
    b.branch(head)
    b.position_at_end(head)
    b.call(regions[0], [ins, cond_outs, scratch] + extra)
    b.cbranch(truth(b, pred, op.regions[0].outputs[0].dtype), body, done)
    b.position_at_end(body)
    b.call(regions[1], [ins, body_outs, scratch] + extra)
    for dst, src, size in zip(results, nexts, sizes):
        emit_memcpy(b, dst, src, size)
    b.branch(head)
    b.position_at_end(done)
