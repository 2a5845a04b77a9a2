"""precision: bf16 — conv2d / matmul in bfloat16 with f32 accumulation (quantize_bf16.py,
the bf16 forms of qgemm8.py).

The kernels are checked against the NumPy interpreter on the same IR (inputs rounded
to bf16 there too, products exact, so only the f32 summation order differs: 1e-5),
with every dot product this host can run (`vdpbf16ps` needs AVX-512-BF16; the generic
form runs anywhere), and against torch's fp32 within bf16's own error. Which targets get
`vdpbf16ps` is checked by cross-compiling."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuvil
from cuvil.api import _to_ir
from cuvil.backend.llvm.codegen import generate
from cuvil.backend.llvm.kernels.bf16 import bf16_transposed
from cuvil.backend.llvm.select import KernelTarget
from cuvil.backend.llvm.target import GENERIC_BF16, DotIsa, Target, bf16_dot_isa, compile_to_asm, host_target
from cuvil.errors import CuvilError
from cuvil.ir import interpreter
from cuvil.ir.ops.quant import bf16_decode, bf16_encode, bf16_round
from cuvil.options import Quantization
from cuvil.passes.pipeline import plan_for
from cuvil.passes.quantize_weights import weight_bytes
from tests.quant.helpers import quantized, run_native
from tests.quant.test_int8_kernels import _Convs, _Linears

HOST = host_target()
HOST_BF16 = HOST.has_feature("avx512bf16") and HOST.has_feature("avx512vl")
DPBF16 = DotIsa(2, "dpbf16ps")
BF16 = Quantization(precision="bf16")
ISAS = [GENERIC_BF16, DPBF16]
# bf16 keeps 8 significant bits: one rounding of each operand is ~2^-9 relative; over
# the sums of these small models the max error against fp32 stays below this
BF16_REL_TOL = 2e-2


def _bf16_module(model, x):
    module = quantized(_to_ir(model, (x,)), "none", precision="bf16")
    ops = [op for op in module.main.body.ops if op.attrs.get("act_quant")]
    assert ops and all(op.attrs["act_quant"] == {"dtype": "bf16"} for op in ops)
    return module


def _rel(got, ref):
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _check(model, x, vector_bits, isa):
    if isa.dot == "dpbf16ps" and not HOST_BF16:
        pytest.skip("this CPU has no AVX-512-BF16")
    module = _bf16_module(model, x)
    ref = interpreter.run(module, [x.numpy()])[0]
    got = run_native(module, [x.numpy()], vector_bits, bf16=isa)[0]
    assert got.shape == ref.shape
    # the same bf16 products, summed in f32; where two sums differ in their last bit, a
    # conv result rounded to bf16 (one a residual reads: quantize_bf16.rounds_result)
    # may round the other way, 2^-8 of that value, diluted by the convs after it
    assert _rel(got, ref) <= 1e-4, _rel(got, ref)
    fp32 = model(x).detach().numpy()
    assert 1e-6 < _rel(got, fp32) <= BF16_REL_TOL      # bf16, not fp32, and not far from it


def _two_threads_give_the_bits_of_one(model, x):
    one = cuvil.compile(model, (x,), quantization=BF16, threads=1)
    two = cuvil.compile(model, (x,), quantization=BF16, threads=2)
    np.testing.assert_array_equal(one(x.numpy())[0], two(x.numpy())[0])


def test_bf16_rounding_matches_torch():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10000),
                        np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, 1e-40, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8],
                                 np.float32)])
    want = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(bf16_round(x), want)   # ties to even, overflow to inf, subnormals kept
    assert np.isnan(bf16_round(np.array([np.nan], np.float32)))[0]
    rows = x[:10000].reshape(100, 100)
    np.testing.assert_array_equal(bf16_decode(bf16_encode(rows)), want[:10000].reshape(100, 100))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.dot)
@pytest.mark.parametrize("vector_bits", [128, 256, 512])
def test_bf16_matmul_matches_the_interpreter(isa, vector_bits):
    x = torch.randn(7, 130, generator=torch.Generator().manual_seed(1))
    _check(_Linears().eval(), x, vector_bits, isa)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.dot)
@pytest.mark.parametrize("vector_bits", [128, 256, 512])
def test_bf16_conv_matches_the_interpreter(isa, vector_bits):
    x = torch.randn(2, 3, 13, 13, generator=torch.Generator().manual_seed(2))
    _check(_Convs().eval(), x, vector_bits, isa)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.dot)
def test_bf16_conv_packing_each_panel_before_its_gemm_matches_the_interpreter(isa):
    """>= 16 panels: each work item packs, converts and multiplies its own panel."""
    x = torch.randn(1, 3, 40, 40, generator=torch.Generator().manual_seed(3))
    _check(_Convs().eval(), x, 512, isa)


class _WideLinears(torch.nn.Module):
    """Enough rows and columns for the L1-blocked GEMM of narrow vectors (gemm.blocked_gemm),
    K over several of its K blocks, N ragged against the panels."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = torch.nn.Linear(600, 70)
        self.l2 = torch.nn.Linear(70, 33, bias=False)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


class _BigConvs(torch.nn.Module):
    """Convs over >= 16 panels (each packed right before its GEMM), enough output channels
    for the blocked GEMM: 3x3 from the padded input copy, pointwise (packed plane copies),
    dilated (im2col element by element), strided."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(8, 24, 3, padding=1)
        self.c2 = torch.nn.Conv2d(24, 32, 1)
        self.c3 = torch.nn.Conv2d(32, 16, 3, padding=2, dilation=2)
        self.c4 = torch.nn.Conv2d(16, 28, 3, stride=2, padding=1)

    def forward(self, x):
        return self.c4(torch.relu(self.c3(torch.relu(self.c2(self.c1(x))))))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.dot)
@pytest.mark.parametrize("vector_bits", [256, 512])
def test_bf16_pointwise_convs_read_their_codes_from_the_input_planes(isa, vector_bits):
    """1x1 convs quantize whole panels straight from the input planes, the ragged last
    one (72 = 2 x 32 + 8 pixels; 4 x 16 + 8 at 256 bits) through the f32 copy; an odd
    channel count pads the last pair; the grouped conv reads its group's planes."""
    model = torch.nn.Sequential(torch.nn.Conv2d(21, 40, 1), torch.nn.ReLU(), torch.nn.Conv2d(40, 36, 1, groups=2),
                                torch.nn.Conv2d(36, 24, 1)).eval()
    _check(model, torch.randn(2, 21, 9, 8, generator=torch.Generator().manual_seed(8)), vector_bits, isa)


class _PaddedCodes(torch.nn.Module):
    """bf16 convs that build their im2col codes straight from the padded input copy
    (qkernels.im2col_codes), in blocks of whole pairs and whole input channels: a 7x7
    stride-2 stem over 3 channels (one block of 98 rows, then 49 with the last pair
    half empty), a 2x2 kernel (blocks of 4 rows), a 1x3 one with stride (1, 2) and a
    3x3 one over 5 channels (2 blocks of 18 rows and a tail of 9)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(12)
        self.c1 = torch.nn.Conv2d(3, 16, 7, stride=2, padding=3)
        self.c2 = torch.nn.Conv2d(16, 5, 2, padding=1)
        self.c3 = torch.nn.Conv2d(5, 5, (1, 3), stride=(1, 2), padding=(0, 1))
        self.c4 = torch.nn.Conv2d(5, 24, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.c4(self.c3(y) + 1.0)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.dot)
@pytest.mark.parametrize("vector_bits", [256, 512])
def test_bf16_convs_take_their_codes_from_the_padded_copy(isa, vector_bits):
    _check(_PaddedCodes().eval(), torch.randn(1, 3, 45, 50, generator=torch.Generator().manual_seed(13)),
           vector_bits, isa)


def test_bf16_convs_from_the_padded_copy_give_two_threads_the_bits_of_one():
    """Each thread packs its panels into its own slot of the scratch."""
    model, x = _PaddedCodes().eval(), torch.randn(1, 3, 45, 50, generator=torch.Generator().manual_seed(14))
    _two_threads_give_the_bits_of_one(model, x)


class _PairPlanes(torch.nn.Module):
    """bf16 convs over an even number of input channels per group copy their padded input
    as plane pairs of codes (qkernels.pair_planes; with vdpbf16ps and masked vectors),
    the weight's K in (pair, tap, channel) order: one group's convs run transposed and
    read each pixel's taps from the pairs (qkernels.gather_at), two groups' ones pack
    each im2col group row as one tap of one pair. 3x3 over a ragged pixel count, stride
    2 (phase-split pairs), two groups of 6 channels, a 2x3 kernel with stride (1, 2),
    and 7x7 planes."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(15)
        self.c1 = torch.nn.Conv2d(4, 12, 3, padding=1)
        self.c2 = torch.nn.Conv2d(12, 12, 3, stride=2, padding=1)
        self.c3 = torch.nn.Conv2d(12, 10, 3, padding=1, groups=2)
        self.c4 = torch.nn.Conv2d(10, 8, (2, 3), stride=(1, 2), padding=(1, 1))
        self.c5 = torch.nn.Conv2d(8, 16, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        y = self.c4(torch.relu(self.c3(y) + 0.5))
        return self.c5(torch.nn.functional.adaptive_avg_pool2d(y, 7))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.dot)
@pytest.mark.parametrize("vector_bits", [128, 256, 512])
def test_bf16_convs_from_plane_pairs_match_the_interpreter(isa, vector_bits):
    from cuvil.backend.llvm.kernels.bf16 import pair_planes
    x = torch.randn(2, 4, 27, 37, generator=torch.Generator().manual_seed(16))
    _check(_PairPlanes().eval(), x, vector_bits, isa)
    module = _bf16_module(_PairPlanes().eval(), x)
    convs = [op for op in module.main.body.ops if op.name == "cuvil.conv2d"]
    chosen = [pair_planes(*(v.type for v in op.operands[:2]), op.result.type, op.attrs, isa, vector_bits // 32)
              for op in convs]
    assert chosen == [isa.dot == "dpbf16ps" and vector_bits > 128] * 5
    gathered = [bf16_transposed(*(v.type for v in op.operands[:2]), op.result.type, op.attrs, vector_bits // 32, isa)
                for op in convs]
    assert [t for c, t in zip(chosen, gathered) if c] == [op.attrs["groups"] == 1 for c, op in zip(chosen, convs) if c]


def test_bf16_convs_from_plane_pairs_give_two_threads_the_bits_of_one():
    if not HOST_BF16:
        pytest.skip("this CPU has no AVX-512-BF16")
    model, x = _PairPlanes().eval(), torch.randn(1, 4, 40, 45, generator=torch.Generator().manual_seed(17))
    _two_threads_give_the_bits_of_one(model, x)


class _SharedWeight(torch.nn.Module):
    """`use(conv, x)`: a model that applies one conv's weight twice."""

    def __init__(self, conv, use):
        super().__init__()
        self.conv, self.use = conv, use

    def forward(self, x):
        return self.use(self.conv, x)


def test_bf16_weight_shared_by_a_dilated_and_a_plain_conv_is_a_clear_error():
    """The plain conv would read the weight in pair order, the dilated one (no padded
    copy) in channel order: one blob cannot serve both."""
    if not HOST_BF16:
        pytest.skip("this CPU has no AVX-512-BF16")
    torch.manual_seed(18)
    model = _SharedWeight(torch.nn.Conv2d(8, 8, 3, padding=1), lambda conv, x: conv(x) + torch.nn.functional.conv2d(
        x, conv.weight, None, padding=2, dilation=2)).eval()
    x = torch.randn(1, 8, 12, 12)
    assert cuvil.compile(model, (x,))(x.numpy())[0].shape == (1, 8, 12, 12)   # f32: fine
    with pytest.raises(CuvilError, match="shared by convs with and without a padded input copy"):
        cuvil.compile(model, (x,), quantization=BF16)


def test_bf16_weight_shared_by_a_transposed_and_a_plain_conv_is_a_clear_error():
    """Over 5 channels (no plane pairs) a conv's 7x7 output runs transposed (W^T panels),
    its 28x28 one in column panels (weight rows): one blob cannot serve both."""
    if not HOST_BF16:
        pytest.skip("this CPU has no AVX-512-BF16")
    torch.manual_seed(19)
    model = _SharedWeight(torch.nn.Conv2d(5, 8, 3, padding=1), lambda conv, x: conv(x).mean() + conv(
        torch.nn.functional.avg_pool2d(x, 4)).mean()).eval()
    x = torch.randn(1, 5, 28, 28)
    want = model(x).detach().numpy()
    np.testing.assert_allclose(cuvil.compile(model, (x,))(x.numpy())[0], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(CuvilError, match="shared by a transposed conv"):
        cuvil.compile(model, (x,), quantization=BF16)


class _ThinPlanes(torch.nn.Module):
    """bf16 convs whose output planes fill the column panels poorly (7x7, 14x14): W^T
    panels times im2col^T codes, transposed back with the epilogue (a bias, ReLU, a
    residual); 1x1 ones read their input planes (49 = 32 + a ragged 17; an odd channel
    count), a strided 3x3 one packs from its phase-split copy."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(9)
        self.c1 = torch.nn.Conv2d(21, 40, 1)
        self.c2 = torch.nn.Conv2d(40, 40, 3, padding=1)
        self.c3 = torch.nn.Conv2d(40, 50, 3, stride=2, padding=1)
        self.c4 = torch.nn.Conv2d(50, 24, 1, bias=False)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c2(y) + y)
        return self.c4(self.c3(torch.nn.functional.interpolate(y, scale_factor=4.0)))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.dot)
@pytest.mark.parametrize("vector_bits", [256, 512])
def test_bf16_convs_of_thin_planes_run_transposed(isa, vector_bits):
    x = torch.randn(2, 21, 7, 7, generator=torch.Generator().manual_seed(10))
    _check(_ThinPlanes().eval(), x, vector_bits, isa)
    module = _bf16_module(_ThinPlanes().eval(), x)
    convs = [op for op in module.main.body.ops if op.name == "cuvil.conv2d"]
    chosen = [bf16_transposed(*(v.type for v in op.operands[:2]), op.result.type, op.attrs, vector_bits // 32, isa)
              for op in convs]
    # 7x7 planes at both widths; 14x14 (196 of 224 lanes) only with 512-bit vectors,
    # except the 3x3 one over 40 channels: plane pairs, read in place (gather_at)
    want = [True, True, True, vector_bits == 512] if isa.dot == "dpbf16ps" else [False] * 4
    assert chosen == want


def test_bf16_transposed_convs_give_two_threads_the_bits_of_one():
    if not HOST_BF16:
        pytest.skip("this CPU has no AVX-512-BF16")
    model, x = _ThinPlanes().eval(), torch.randn(1, 21, 7, 7, generator=torch.Generator().manual_seed(11))
    _two_threads_give_the_bits_of_one(model, x)


@pytest.mark.parametrize("vector_bits", [128, 256, 512])
def test_plain_bf16_blocked_matmul_matches_the_interpreter(vector_bits):
    """The f32 GEMMs on bf16 panels (widened per K block into L1) and A rounded once."""
    x = torch.randn(2, 29, 600, generator=torch.Generator().manual_seed(5))
    _check(_WideLinears().eval(), x, vector_bits, GENERIC_BF16)


@pytest.mark.parametrize("vector_bits", [128, 256, 512])
def test_plain_bf16_convs_match_the_interpreter(vector_bits):
    x = torch.randn(1, 8, 20, 21, generator=torch.Generator().manual_seed(6))
    _check(_BigConvs().eval(), x, vector_bits, GENERIC_BF16)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.dot)
def test_bf16_3x3_convs_keep_the_bf16_arithmetic(isa):
    """A conv of the shape f32 runs by Winograd on 512-bit vectors (kernels.conv_winograd)
    keeps the bf16 products of its own input and weight in the bf16 mode."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 24, 3, padding=1), torch.nn.ReLU()).eval()
    _check(model, torch.randn(1, 16, 14, 15, generator=torch.Generator().manual_seed(6)), 512, isa)


def test_plain_bf16_matmul_with_a_runtime_row_count_rounds_a_in_its_tiles():
    model = _WideLinears().eval()
    dyn = cuvil.compile(model, (torch.randn(3, 600),), quantization=BF16, dynamic_shapes=[("b", 600)],
                        dim_bounds={"b": (1, 40)})
    for rows in (1, 13, 40):
        x = torch.randn(rows, 600, generator=torch.Generator().manual_seed(rows))
        got = dyn(x.numpy())[0]
        ref = interpreter.run(_bf16_module(model, x), [x.numpy()])[0]
        assert _rel(got, ref) <= 1e-5, (rows, _rel(got, ref))
        assert 1e-6 < _rel(got, model(x).detach().numpy()) <= BF16_REL_TOL


def test_plain_bf16_keeps_nan_and_inf():
    model = _WideLinears().l1.eval()
    x = torch.randn(20, 600, generator=torch.Generator().manual_seed(7))
    x[7, 9] = float("inf")
    x[3, 6] = torch.from_numpy(np.array([0x7FFFFFFF], np.uint32).view(np.float32))[0]  # a NaN rounding would wrap
    got = run_native(_bf16_module(model, x), [x.numpy()], 256, bf16=GENERIC_BF16)[0]
    ref = interpreter.run(_bf16_module(model, x), [x.numpy()])[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    assert np.isnan(got[3]).all() and np.isinf(got[7]).all()
    fine = np.delete(np.arange(20), [3, 7])
    assert _rel(got[fine], ref[fine]) <= 1e-5


def test_bf16_rewrite_halves_the_weights_and_leaves_the_rest_f32():
    model = _Convs().eval()
    x = torch.randn(1, 3, 13, 13)
    fp32 = weight_bytes(quantized(_to_ir(model, (x,)), "none"))
    module = _bf16_module(model, x)
    assert 0.5 <= weight_bytes(module) / fp32 < 0.52   # bf16 weights, f32 biases
    assert module.main.attrs["precision"] == {"bf16_ops": 5}
    dw = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, groups=8), torch.nn.Conv2d(8, 16, 1)).eval()
    module = quantized(_to_ir(dw, (torch.randn(1, 8, 6, 6),)), "none", precision="bf16")
    kinds = [bool(op.attrs.get("act_quant")) for op in module.main.body.ops if op.name == "cuvil.conv2d"]
    assert kinds == [False, True]   # the depthwise conv stays f32


def test_bf16_errors():
    model, x = _Linears().eval(), torch.randn(7, 130)
    with pytest.raises(CuvilError, match="does not combine with quantization 'fp16'"):
        Quantization("fp16", precision="bf16")
    with pytest.raises(CuvilError, match="precision 'f16' is not supported"):
        Quantization(precision="f16")


def test_bf16_shared_library_matches_jit_and_threads():
    model, x = _Linears().eval(), torch.randn(31, 130, generator=torch.Generator().manual_seed(4))
    one = cuvil.compile(model, (x,), quantization=BF16)(x.numpy())[0]
    two = cuvil.compile(model, (x,), quantization=BF16, threads=2)(x.numpy())[0]
    np.testing.assert_array_equal(one, two)
    assert _rel(one, model(x).detach().numpy()) <= BF16_REL_TOL


def test_the_bf16_dot_product_per_target():
    v512 = Target("x86_64-unknown-linux-gnu", "sapphirerapids",
                  "+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512bf16,-prefer-256-bit")
    plain = Target("x86_64-unknown-linux-gnu", "skylake-avx512", "+avx2,+fma,+avx512f,+avx512bw,+avx512vl")
    assert bf16_dot_isa(v512, 16) == DPBF16 and bf16_dot_isa(v512, 8) == DPBF16
    assert bf16_dot_isa(plain, 16) == GENERIC_BF16 and bf16_dot_isa(None, 8) == GENERIC_BF16
    assert bf16_dot_isa(Target.from_triple("aarch64-unknown-linux-gnu"), 4) == GENERIC_BF16


@pytest.mark.parametrize("features, want", [
    ("+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+avx512bf16,-prefer-256-bit", True),
    ("+avx2,+fma,+avx512f,+avx512bw,+avx512vl,-prefer-256-bit", False)])
def test_cross_compiled_bf16_kernels_use_vdpbf16ps_where_the_target_has_it(features, want):
    x = torch.randn(7, 130)
    module = _bf16_module(_Linears().eval(), x)
    target = Target("x86_64-unknown-linux-gnu", "sapphirerapids" if want else "skylake-avx512", features)
    asm = compile_to_asm(generate(plan_for(module, KernelTarget.of(target)), "bx").llvm_ir, target)
    assert any("vdpbf16ps" in line and "zmm" in line for line in asm.splitlines()) == want
    assert ("vcvtneps2bf16" in asm) == want
