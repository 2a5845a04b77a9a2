"""LLVM infrastructure: targets, for_range, float32 math, weights blobs.

Code is compiled for the host (and for x86-64 without FMA, also runnable here),
linked into a .so with the C compiler, and checked with ctypes against NumPy.
(Linking artifacts is cuvil.native's, tested in tests/runtime/test_native.py.)
"""

from __future__ import annotations

import ctypes
import math
import struct
import subprocess

import numpy as np
import pytest
from llvmlite import ir

from cuvil.backend.llvm import loops, mathlib, target, weights
from cuvil.errors import BackendError

F32 = ir.FloatType()
I64 = ir.IntType(64)
F32P = F32.as_pointer()
X86 = "x86_64-unknown-linux-gnu"
# AVX-512 spelled out, on the CPU name LLVM reports for this host (which would
# otherwise prefer 256-bit vectors), so the test does not depend on the host.
AVX512 = target.Target(X86, "rocketlake", "+avx,+avx2,+fma,+avx512f,+avx512dq,+avx512bw,+avx512vl,-prefer-256-bit")
BASELINE_X86 = target.Target.from_triple(X86)  # SSE2 only: no FMA, 4-wide


def _noalias_fn(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    fn = ir.Function(module, ir.FunctionType(ret, args), name)
    for arg in fn.args:
        if isinstance(arg.type, ir.PointerType):
            arg.add_attribute("noalias")
    return fn


def _saxpy_module() -> ir.Module:
    """void saxpy(float* noalias y, float* noalias x, float a, i64 n): y += a*x."""
    module = ir.Module("saxpy")
    fn = _noalias_fn(module, "saxpy", ir.VoidType(), [F32P, F32P, F32, I64])
    y, x, a, n = fn.args
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    with loops.for_range(builder, n) as i:
        yi = builder.gep(y, [i])
        builder.store(builder.fadd(builder.load(yi), builder.fmul(a, builder.load(builder.gep(x, [i])))), yi)
    builder.ret_void()
    return module


def _map_module() -> ir.Module:
    """void map_<name>(float* out, float* in, i64 n) for every math function."""
    module = ir.Module("maps")
    for name in sorted(mathlib.NAMES):
        fn = _noalias_fn(module, f"map_{name}", ir.VoidType(), [F32P, F32P, I64])
        out, inp, n = fn.args
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        with loops.for_range(builder, n) as i:
            value = builder.call(mathlib.get_math(module, name), [builder.load(builder.gep(inp, [i]))])
            builder.store(value, builder.gep(out, [i]))
        builder.ret_void()
        # the same formula on <16 x float> vectors (n a multiple of 16)
        fn = _noalias_fn(module, f"vmap_{name}", ir.VoidType(), [F32P, F32P, I64])
        out, inp, n = fn.args
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        vp = ir.VectorType(F32, 16).as_pointer()
        with loops.for_range(builder, builder.sdiv(n, ir.Constant(I64, 16))) as i:
            at = builder.mul(i, ir.Constant(I64, 16))
            value = builder.call(mathlib.get_math(module, name, 16),
                                 [builder.load(builder.bitcast(builder.gep(inp, [at]), vp), align=4)])
            builder.store(value, builder.bitcast(builder.gep(out, [at]), vp), align=4)
        builder.ret_void()
    return module


def _build_so(tmp_path, name: str, ir_text: str, tgt: target.Target, extra_objects=()) -> ctypes.CDLL:
    obj = tmp_path / f"{name}.o"
    obj.write_bytes(target.compile_to_object(ir_text, tgt))
    lib = tmp_path / f"lib{name}.so"
    subprocess.run(["cc", "-shared", "-o", str(lib), str(obj), *map(str, extra_objects), "-lm"], check=True)
    return ctypes.CDLL(str(lib))


def _ptr(array: np.ndarray) -> ctypes.c_void_p:
    return array.ctypes.data_as(ctypes.c_void_p)


# --- targets ----------------------------------------------------------------


def test_targets_are_explicit():
    target.initialize()
    target.initialize()  # idempotent
    assert target.Target.from_triple("aarch64-unknown-linux-gnu").features == "+neon"
    assert target.Target.from_triple("wasm32-unknown-wasi").features == "+simd128"
    assert target.Target.from_triple(X86, cpu="znver4", features="+avx2") == target.Target(X86, "znver4", "+avx2")
    with pytest.raises(BackendError, match="riscv64"):
        target.Target.from_triple("riscv64-unknown-linux-gnu")
    host = target.host_target()
    assert host.features.startswith("+") and "," in host.features
    assert AVX512.vector_bits == 512 and BASELINE_X86.vector_bits == 128
    assert target.Target(X86, "x", "+avx512f,+prefer-256-bit").vector_bits == 256


@pytest.mark.parametrize(
    "triple, magic",
    [(X86, b"\x7fELF"), ("aarch64-unknown-linux-gnu", b"\x7fELF"), ("wasm32-unknown-wasi", b"\0asm")],
)
def test_compile_to_object_is_deterministic(triple, magic):
    text = str(_map_module())
    tgt = target.Target.from_triple(triple)
    first = target.compile_to_object(text, tgt)
    assert first[:4] == magic
    assert target.compile_to_object(text, tgt) == first
    if magic == b"\x7fELF":  # e_machine: x86-64 = 62, AArch64 = 183
        assert struct.unpack_from("<H", first, 18)[0] == (62 if triple == X86 else 183)


def test_invalid_ir_raises_backend_error():
    with pytest.raises(BackendError, match="invalid"):
        target.compile_to_object("define i32 @f() {\n  ret i64 0\n}\n", BASELINE_X86)


# --- loops ------------------------------------------------------------------


def test_saxpy_vectorises_to_avx512():
    text = str(_saxpy_module())
    optimized = target.optimized_ir(text, AVX512)
    assert "<16 x float>" in optimized
    assert "zmm" in target.compile_to_asm(text, AVX512)
    # The same loop on baseline x86-64 is 4-wide, so the check above is real.
    assert "<16 x float>" not in target.optimized_ir(text, BASELINE_X86)


def test_host_target_uses_zmm_when_it_has_avx512():
    host = target.host_target()
    if not host.has_feature("avx512f"):
        pytest.skip("host has no AVX-512")
    assert "<16 x float>" in target.optimized_ir(str(_saxpy_module()), host)


def test_for_range_bounds_and_steps(tmp_path):
    """i64 sum_<k>(i64 start, i64 stop) over range(start, stop, step) for several steps."""
    module = ir.Module("ranges")
    steps = {"up3": 3, "down2": -2}
    for label, step in steps.items():
        fn = ir.Function(module, ir.FunctionType(I64, [I64, I64]), f"sum_{label}")
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        acc = loops.alloca_in_entry(builder, I64, "acc")
        builder.store(ir.Constant(I64, 0), acc)
        with loops.for_range(builder, fn.args[1], start=fn.args[0], step=step) as i:
            builder.store(builder.add(builder.load(acc), i), acc)
        builder.ret(builder.load(acc))
    # Nested loops with an ir.Value step: sum over i < n, j in range(i, n, s) of j.
    fn = ir.Function(module, ir.FunctionType(I64, [I64, I64]), "nested")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    acc = loops.alloca_in_entry(builder, I64, "acc")
    builder.store(ir.Constant(I64, 0), acc)
    with loops.for_range(builder, fn.args[0], name="i") as i:
        with loops.for_range(builder, fn.args[0], start=i, step=fn.args[1], name="j") as j:
            builder.store(builder.add(builder.load(acc), j), acc)
    builder.ret(builder.load(acc))

    lib = _build_so(tmp_path, "ranges", str(module), target.host_target())
    for name in ("sum_up3", "sum_down2", "nested"):
        getattr(lib, name).restype = ctypes.c_int64
        getattr(lib, name).argtypes = [ctypes.c_int64, ctypes.c_int64]
    for start, stop in [(0, 10), (-7, 20), (5, 5), (9, 2)]:
        assert lib.sum_up3(start, stop) == sum(range(start, stop, 3))
        assert lib.sum_down2(stop, start) == sum(range(stop, start, -2))
    assert lib.nested(7, 2) == sum(j for i in range(7) for j in range(i, 7, 2))


# --- float32 math -----------------------------------------------------------

_SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, 3.4e38, -3.4e38, 1.0, -1.0, 100.0, -100.0],
    np.float32,
)


@pytest.fixture(scope="module", params=["host", "baseline"])
def math_lib(request, tmp_path_factory):
    tgt = target.host_target() if request.param == "host" else BASELINE_X86
    lib = _build_so(tmp_path_factory.mktemp(request.param), "maps", str(_map_module()), tgt)

    def run(name: str, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        out = np.empty_like(x)
        fn = f"vmap_{name[1:]}" if name[0] == "v" else f"map_{name}"  # "v" + name: the vector form
        getattr(lib, fn)(_ptr(out), _ptr(x), ctypes.c_int64(x.size))
        return out

    return run


def _sweep(lo: float, hi: float, n: int = 100_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([np.linspace(lo, hi, n), rng.uniform(lo, hi, n)]).astype(np.float32)


def test_exp_accuracy_and_specials(math_lib):
    x = np.concatenate([_sweep(-87.3, 88.7), _sweep(-1, 1)])
    ref = np.exp(x.astype(np.float64))
    normal = ref >= np.finfo(np.float32).tiny
    assert np.max(np.abs(math_lib("exp", x)[normal] - ref[normal]) / ref[normal]) <= 3e-7
    sub = _sweep(-103.0, -87.4, 10_000)  # subnormal results: gradual underflow
    assert np.max(np.abs(math_lib("exp", sub) - np.exp(sub.astype(np.float64)))) <= 2e-45
    y = math_lib("exp", np.array([-np.inf, np.inf, np.nan, 89.0, 1e30, -1e30, -104.0, 0.0], np.float32))
    np.testing.assert_array_equal(y[[0, 1, 3, 4, 5, 6, 7]], [0, np.inf, np.inf, np.inf, 0, 0, 1])
    assert np.isnan(y[2])


def test_log_accuracy_and_specials(math_lib):
    rng = np.random.default_rng(1)
    bits = rng.integers(1, 0x7F800000, 300_000, dtype=np.uint32)  # every positive finite float, subnormals too
    x = np.concatenate([bits.view(np.float32), _sweep(0.5, 2.0), _sweep(1e-6, 50.0)])
    ref = np.log(x.astype(np.float64))
    y = math_lib("log", x)
    nonzero = ref != 0
    assert np.max(np.abs(y[nonzero] - ref[nonzero]) / np.abs(ref[nonzero])) <= 3e-7
    assert np.all(y[~nonzero] == 0)
    y = math_lib("log", np.array([0.0, -0.0, np.inf, -1.0, -np.inf, np.nan, 1.0], np.float32))
    np.testing.assert_array_equal(y[[0, 1, 2, 6]], [-np.inf, -np.inf, np.inf, 0.0])
    assert np.all(np.isnan(y[[3, 4, 5]]))


@pytest.mark.parametrize(
    "name, ref, saturated",
    [
        ("tanh", np.tanh, (-1.0, 1.0)),
        ("erf", np.vectorize(math.erf), (-1.0, 1.0)),
        ("sigmoid", lambda v: 0.5 * (1.0 + np.tanh(0.5 * v)), (0.0, 1.0)),
    ],
)
def test_bounded_functions_accuracy_and_specials(math_lib, name, ref, saturated):
    x = np.concatenate([_sweep(-10, 10), _sweep(-1.5, 1.5, seed=2), _sweep(-200, 200, 10_000, seed=3)])
    y = math_lib(name, x)
    assert np.max(np.abs(y - ref(x.astype(np.float64)))) <= 3e-7
    y = math_lib(name, _SPECIALS)
    lo, hi = saturated
    np.testing.assert_array_equal(y[[2, 3, 8, 9]], [hi, lo, hi, lo])
    assert np.isnan(y[4])
    assert not np.any(np.isnan(y[np.isfinite(_SPECIALS)]))
    if name != "sigmoid":  # odd functions keep the sign of zero and are exact near it
        assert np.signbit(y[1]) and not np.signbit(y[0])
        small = np.float32([1e-30, -3e-8, 1e-5])
        scale = 2 / math.sqrt(math.pi) if name == "erf" else 1.0
        np.testing.assert_allclose(math_lib(name, small), small * scale, rtol=3e-7)


@pytest.mark.parametrize("name", sorted(mathlib.NAMES))
def test_vector_math_gives_the_scalar_bits(math_lib, name):
    """get_math(..., lanes) is the scalar formula on vectors, bit for bit."""
    x = np.concatenate([_sweep(-120, 120, 50_000), _sweep(-2, 2, 50_000, seed=5), np.abs(_sweep(0, 1e-30, 1000)),
                        _SPECIALS, np.zeros(-len(_SPECIALS) % 16, np.float32)])
    np.testing.assert_array_equal(math_lib(name, x).view(np.uint32), math_lib("v" + name, x).view(np.uint32))


def test_math_loop_is_inlined_and_vectorised():
    optimized = target.optimized_ir(str(_map_module()), AVX512)
    assert "@cuvil.math." not in optimized  # every call was inlined, the functions dropped
    for name in mathlib.NAMES:
        body = optimized.split(f"@map_{name}(")[1].split("\n}\n")[0]
        assert "<16 x float>" in body, name


def test_get_math_declares_once():
    module = ir.Module("m")
    assert mathlib.get_math(module, "exp") is mathlib.get_math(module, "exp")
    assert mathlib.get_math(module, "tanh").linkage == "internal"
    assert "alwaysinline" in mathlib.get_math(module, "erf").attributes
    with pytest.raises(KeyError, match="cosh"):
        mathlib.get_math(module, "cosh")


# --- weights blob -----------------------------------------------------------


@pytest.mark.parametrize("triple", [X86, "aarch64-unknown-linux-gnu", "wasm32-unknown-wasi"])
def test_weights_object_is_path_free_and_deterministic(tmp_path, triple):
    data = np.random.default_rng(4).integers(0, 256, 300_001, dtype=np.uint8).tobytes()
    tgt = target.Target.from_triple(triple)
    objects = []
    for sub in ("first_dir", "second_dir"):
        folder = tmp_path / sub
        folder.mkdir()
        (folder / "weights.bin").write_bytes(data)
        obj = weights.weights_object("cuvil_weights", folder / "weights.bin", tgt)
        out = weights.write_weights_object(folder / "w.o", "cuvil_weights", folder / "weights.bin", tgt)
        assert out.read_bytes() == obj
        assert str(tmp_path).encode() not in obj and b"weights.bin" not in obj
        objects.append(obj)
    assert objects[0] == objects[1] == weights.weights_object("cuvil_weights", data, tgt)
    assert objects[0].count(data) == 1
    with pytest.raises(BackendError, match="identifier"):
        weights.weights_object("bad name", data, tgt)
    assert b"cuvil_no_weights" in weights.weights_object("cuvil_no_weights", b"", tgt)  # a model without weights


def test_end_to_end_kernel_with_weights(tmp_path):
    """out[i] = a[i] + b[i] * w[i], with w the float32 weights blob, via a linked .so."""
    n = 1000
    rng = np.random.default_rng(5)
    w = rng.standard_normal(n).astype(np.float32)
    tgt = target.host_target()
    module = ir.Module("e2e")
    blob, blob_obj = weights.add_weights_blob(module, "cuvil_test_weights_blob", w.tobytes(), tgt)
    assert str(blob) == f'@"cuvil_test_weights_blob" = external hidden constant [{4 * n} x i8], align 64'
    assert weights.declare_weights(module, "cuvil_test_weights_blob", 4 * n) is blob
    fn = _noalias_fn(module, "cuvil_test_add", ir.VoidType(), [F32P, F32P, F32P, I64])
    out, a, b, count = fn.args
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    w_ptr = builder.bitcast(blob, F32P)
    with loops.for_range(builder, count) as i:
        at = lambda p: builder.load(builder.gep(p, [i]))  # noqa: E731
        builder.store(builder.fadd(at(a), builder.fmul(at(b), at(w_ptr))), builder.gep(out, [i]))
    builder.ret_void()
    getter = ir.Function(module, ir.FunctionType(F32P, []), "cuvil_test_weights")
    getter_builder = ir.IRBuilder(getter.append_basic_block("entry"))
    getter_builder.ret(getter_builder.bitcast(blob, F32P))

    (tmp_path / "weights.o").write_bytes(blob_obj)
    lib = _build_so(tmp_path, "e2e", str(module), tgt, [tmp_path / "weights.o"])
    lib.cuvil_test_weights.restype = ctypes.c_void_p
    address = lib.cuvil_test_weights()
    assert address % weights.WEIGHTS_ALIGN == 0
    np.testing.assert_array_equal(np.ctypeslib.as_array((ctypes.c_float * n).from_address(address)), w)
    a_arr, b_arr = rng.standard_normal((2, n)).astype(np.float32)
    result = np.zeros(n, np.float32)
    lib.cuvil_test_add(_ptr(result), _ptr(a_arr), _ptr(b_arr), ctypes.c_int64(n))
    np.testing.assert_allclose(result, a_arr + b_arr * w, rtol=1e-6, atol=1e-6)

