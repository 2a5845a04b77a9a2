"""The kernel of `cuvil.custom`: a call to the named C function of a plugin module.

The generated kernel builds one `cuvil_op_tensor` per operand and one for the result
(see cuvil_plugin.h: data pointer, dtype, rank, shape pointer, element count) on its
stack, with the shapes and the op's `params` as constants, and calls

    void symbol(const cuvil_op_tensor *out, const cuvil_op_tensor *ins, int32_t n_ins,
                const double *params, int32_t n_params);

The struct is built from LLVM types (pointer, i32, i32, pointer, i64), so its layout
is the C compiler's on every target (8-byte pointers on x86_64/aarch64, 4 on wasm32).
The symbol stays undefined in the model object; the link stage brings the plugin.
"""
from __future__ import annotations

from llvmlite import ir

from ....errors import BackendError
from ....ir.types import TensorType
from ..emit import F64, I32, I64, PTR, i64

# cuvil_dtype values (cuvil_runtime.h)
DTYPE_CODES = {"f32": 1, "f16": 2, "f64": 3, "i64": 4, "i32": 5, "i8": 6, "u8": 7, "bool": 8}
OP_TENSOR = ir.LiteralStructType([PTR, I32, I32, I64.as_pointer(), I64])
CUSTOM_FN = ir.FunctionType(ir.VoidType(), [OP_TENSOR.as_pointer(), OP_TENSOR.as_pointer(), I32,
                                            F64.as_pointer(), I32])


def _declare(module: ir.Module, symbol: str) -> ir.Function:
    existing = module.globals.get(symbol)
    if existing is None:
        return ir.Function(module, CUSTOM_FN, name=symbol)
    if not isinstance(existing, ir.Function) or existing.function_type != CUSTOM_FN:
        raise BackendError(f"cuvil.custom: the symbol {symbol!r} clashes with another definition in the model")
    return existing


def _const_array(module: ir.Module, name: str, elem: ir.Type, values) -> ir.Value:
    ty = ir.ArrayType(elem, len(values))
    gv = ir.GlobalVariable(module, ty, module.get_unique_name(name))
    gv.global_constant = True
    gv.linkage = "internal"
    gv.initializer = ir.Constant(ty, [ir.Constant(elem, v) for v in values])
    return gv.gep([ir.Constant(I32, 0), ir.Constant(I32, 0)])


def _fill(b: ir.IRBuilder, slot: ir.Value, data: ir.Value, t: TensorType, name: str) -> None:
    module = b.module
    shape = (_const_array(module, f"{name}.shape", I64, list(t.shape)) if t.shape
             else ir.Constant(I64.as_pointer(), None))
    fields = [b.bitcast(data, PTR), ir.Constant(I32, DTYPE_CODES[t.dtype]), ir.Constant(I32, len(t.shape)),
              shape, i64(t.numel)]
    for k, v in enumerate(fields):
        b.store(v, b.gep(slot, [ir.Constant(I32, 0), ir.Constant(I32, k)], inbounds=True))


def emit_custom(b: ir.IRBuilder, args) -> None:
    """Kernel body for `cuvil.custom` (args: a codegen KernelArgs)."""
    symbol = args.attrs["symbol"]
    if any(p is None for p in args.ins):
        raise BackendError(f"cuvil.custom {symbol}: operands must be in memory")
    fn = _declare(b.module, symbol)
    out = b.alloca(OP_TENSOR, name="out")
    _fill(b, out, args.out, args.out_type, f"{symbol}.out")
    n = len(args.ins)
    ins = b.alloca(OP_TENSOR, size=max(n, 1), name="ins")
    for i, (p, t) in enumerate(zip(args.ins, args.in_types)):
        _fill(b, b.gep(ins, [ir.Constant(I32, i)], inbounds=True), p, t, f"{symbol}.in{i}")
    params = [float(v) for v in args.attrs.get("params", [])]
    pptr = (_const_array(b.module, f"{symbol}.params", F64, params) if params
            else ir.Constant(F64.as_pointer(), None))
    b.call(fn, [out, ins, ir.Constant(I32, n), pptr, ir.Constant(I32, len(params))])
