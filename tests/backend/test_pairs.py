"""bf16 conv results stored as plane pairs of codes (bf16.stored_pairs): where every
reader is a bf16 conv that rounds its input to bf16 anyway, the producer stores the
codes of channels 2i and 2i + 1 together and the readers skip their conversion. The
numbers must not change at all: checked bit for bit against the same module without
pairs, and against the interpreter, for column-panel and transposed producers (ragged
channel panels, odd row blocks), and 1x1 (column-panel, ragged panels, transposed) and
3x3 (stride 1 and 2) readers, batch 2; and that a result read elsewhere stays f32.
A conv result that convs also read as a residual is rounded to bf16 in its epilogue
(quantize_bf16.rounds_result) and stored as pairs too: ResNet stages with the memory
plan's in-place convs and the strided projection's slice, against the same module
without pairs, the interpreter and torch; and a max pool between a stem conv and
convs passing the pairs on."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import cuvil
from cuvil.api import _to_ir
from cuvil.backend.llvm import select
from cuvil.backend.llvm.kernels import bf16
from cuvil.backend.llvm.select import KernelTarget, SelectStorage, kernel_passes
from cuvil.backend.llvm.target import DotIsa, host_target
from cuvil.ir import interpreter, parse_module
from cuvil.ir.ops.quant import bf16_round
from cuvil.passes.pipeline import default_pipeline, plan_for, run_pipeline
from tests.quant.helpers import quantized, run_native

HOST = host_target()
DPBF16 = DotIsa(2, "dpbf16ps")

pytestmark = pytest.mark.skipif(not (HOST.has_feature("avx512bf16") and HOST.has_feature("avx512vl")),
                                reason="this CPU has no AVX-512-BF16")


class _Chain(nn.Module):
    """ResNet's bottleneck without its residual: reduce 1x1 -> ReLU -> 3x3 -> ReLU ->
    expand 1x1; `both` also returns the 3x3 conv's result."""

    def __init__(self, cin, mid, cout, stride, both=False):
        super().__init__()
        torch.manual_seed(cin * mid + stride)
        self.reduce, self.expand = nn.Conv2d(cin, mid, 1), nn.Conv2d(mid, cout, 1)
        self.conv = nn.Conv2d(mid, mid, 3, stride, 1)
        self.both = both

    def forward(self, x):
        h = torch.relu(self.conv(torch.relu(self.reduce(x))))
        y = self.expand(h)
        return (y, h) if self.both else y


CASES = [  # cin, mid, cout, stride, input shape
    (32, 40, 64, 1, (1, 32, 24, 26)),   # 624 pixels: a ragged last panel; 40 channels: a ragged channel panel
    (48, 38, 48, 2, (2, 48, 28, 28)),   # 38 channels: a last row block of 2; a 14x14 (transposed) expand; batch 2
    (16, 64, 32, 1, (1, 16, 7, 7)),     # thin planes: every conv transposed
]


def _run(module, x, monkeypatch, pairs: bool, bits: int = 512):
    """Run module natively at `bits` with its results stored as pairs where chosen
    (`pairs`) or never; also the number of ops chosen."""
    target = KernelTarget(bits // 32, bf16=DPBF16)
    plan_for(module, target)
    chosen = []
    real = bf16.stored_pairs

    def spy(*args, **kwargs):
        got = real(*args, **kwargs) if pairs else set()
        chosen.append(len(got))
        return got
    monkeypatch.setattr(select, "stored_pairs", spy)
    SelectStorage(target).apply(module)
    return run_native(module, [x], bits, bf16=DPBF16), chosen[0]


@pytest.mark.parametrize("bits", [256, 512])
@pytest.mark.parametrize("cin, mid, cout, stride, shape", CASES)
def test_pairs_change_no_bit_of_the_result(cin, mid, cout, stride, shape, bits, monkeypatch):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(stride)).numpy()
    module = quantized(_to_ir(_Chain(cin, mid, cout, stride).eval(), (torch.from_numpy(x),)), "none",
                       precision="bf16")
    (got,), chosen = _run(module, x, monkeypatch, True, bits)
    assert chosen == 2   # the reduce conv's result and the 3x3 conv's
    (plain,), none = _run(module, x, monkeypatch, False, bits)
    assert none == 0
    np.testing.assert_array_equal(got, plain)
    ref = interpreter.run(module, [x])[0]
    # the interpreter rounds the same bf16 inputs; f32 sums in another order, and a
    # rounding of an f32 value may then round a bf16 input the other way (2^-8 of it)
    assert float(np.abs(got - ref).max()) <= 4e-3 * float(np.abs(ref).max())


class _Gated(_Chain):
    """The 3x3 conv's epilogue also scales by a value per image ([N, 1, 1, 1]: read row
    by row, where the bias is a vector over the channels)."""

    def forward(self, x):
        gate = torch.sigmoid(x.mean((1, 2, 3), keepdim=True))
        h = torch.relu(self.conv(torch.relu(self.reduce(x)))) * gate
        return self.expand(h)


def test_an_epilogue_operand_per_image_is_read_row_by_row(monkeypatch):
    x = torch.randn(2, 16, 7, 7, generator=torch.Generator().manual_seed(4)).numpy()
    module = quantized(_to_ir(_Gated(16, 64, 32, 1).eval(), (torch.from_numpy(x),)), "none", precision="bf16")
    conv = [op for op in module.main.body.ops if op.name == "cuvil.conv2d"][1]
    assert len(conv.operands) == 4   # the bias and the gate in its epilogue
    (got,), chosen = _run(module, x, monkeypatch, True)
    assert chosen == 2
    (plain,), _ = _run(module, x, monkeypatch, False)
    np.testing.assert_array_equal(got, plain)


def test_a_result_read_elsewhere_stays_f32(monkeypatch):
    x = torch.randn(1, 32, 24, 26, generator=torch.Generator().manual_seed(3)).numpy()
    model = _Chain(32, 40, 64, 1, both=True).eval()
    module = quantized(_to_ir(model, (torch.from_numpy(x),)), "none", precision="bf16")
    (y, h), chosen = _run(module, x, monkeypatch, True)
    assert chosen == 1   # only the reduce conv's: the 3x3 conv's result is also an output
    want_y, want_h = interpreter.run(module, [x])
    for got, want in ((y, want_y), (h, want_h)):
        assert float(np.abs(got - want).max()) <= 4e-3 * float(np.abs(want).max())


def test_no_pairs_without_the_bf16_dot_product_or_masked_vectors():
    x = torch.randn(1, 32, 24, 26)
    module = quantized(_to_ir(_Chain(32, 40, 64, 1).eval(), (x,)), "none", precision="bf16")
    ops, outs = module.main.body.ops, {id(v) for v in module.main.outputs}
    assert len(bf16.stored_pairs(ops, outs, DPBF16, 16)) == 2
    assert not bf16.stored_pairs(ops, outs, DPBF16, 4)                       # 128-bit vectors
    assert not bf16.stored_pairs(ops, outs, DotIsa(2, "bf16"), 16)          # no vdpbf16ps


class _Bottleneck(nn.Module):
    """ResNet-50's bottleneck: reduce 1x1 -> 3x3 (stride) -> expand 1x1, plus the block's
    input or, where the shape changes, a strided 1x1 projection of it (a slice and a 1x1
    conv after canonicalize), then ReLU."""

    def __init__(self, cin, mid, cout, stride):
        super().__init__()
        self.reduce, self.conv = nn.Conv2d(cin, mid, 1), nn.Conv2d(mid, mid, 3, stride, 1)
        self.expand = nn.Conv2d(mid, cout, 1)
        self.project = nn.Conv2d(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x):
        y = self.expand(torch.relu(self.conv(torch.relu(self.reduce(x)))))
        return torch.relu(y + (x if self.project is None else self.project(x)))


class _Stages(nn.Module):
    """Two ResNet stages of bottlenecks, then a 1x1 conv and a global mean: the residual
    stream between blocks is read by convs only, as input and as residual."""

    def __init__(self, cin, widths, blocks, stride):
        super().__init__()
        torch.manual_seed(sum(widths) + blocks)
        layers, c = [], cin
        for i, w in enumerate(widths):
            for j in range(blocks):
                layers.append(_Bottleneck(c, w // 4, w, stride if i and not j else 1))
                c = w
        self.blocks, self.head = nn.Sequential(*layers), nn.Conv2d(c, 10, 1)

    def forward(self, x):
        return self.head(self.blocks(x)).mean((2, 3))


STAGE_CASES = [  # cin, widths, blocks, stride, input shape, vector bits, whether convs write over their residual
    (16, (64, 128), 3, 2, (1, 16, 32, 32), 512, True),     # 32x32 and 16x16 planes: whole panels, in place
    (24, (32, 64), 2, 2, (2, 24, 14, 14), 512, False),     # every conv transposed, batch 2
    (16, (64, 96), 2, 2, (1, 16, 18, 24), 512, False),     # 432 pixels: a ragged panel; then 9x12, transposed
    (24, (32, 64), 2, 2, (2, 24, 16, 16), 256, False),     # 256-bit vectors, batch 2
    (16, (32, 64), 2, 2, (2, 16, 2, 2), 512, False),       # 1x1 planes after the stride: a residual per channel
]


def _planned(model, x, bits):
    """The bf16 module, memory planned for `bits`-wide vectors (the convs that write over
    their residual there do)."""
    return run_pipeline(_to_ir(model, (torch.from_numpy(x),)),
                        default_pipeline(**kernel_passes(KernelTarget(bits // 32, bf16=DPBF16)),
                                         quantize_weights={"method": "none", "precision": "bf16"}), verify_each=True)


@pytest.mark.parametrize("cin, widths, blocks, stride, shape, bits, over", STAGE_CASES)
def test_the_residual_stream_is_stored_as_pairs(cin, widths, blocks, stride, shape, bits, over, monkeypatch):
    x = torch.relu(torch.randn(*shape, generator=torch.Generator().manual_seed(blocks))).numpy()
    model = _Stages(cin, widths, blocks, stride).eval()
    module = _planned(model, x, bits)
    ops, outs = module.main.body.ops, {id(v) for v in module.main.outputs}
    chosen = bf16.stored_pairs(ops, outs, DPBF16, bits // 32)
    convs = [op for op in ops if op.name == "cuvil.conv2d"]
    # every conv result but the head's (the mean reads it) is read by convs only: pairs;
    # those read as a residual too are rounded to bf16 in their epilogue first
    assert {id(op) for op in convs[:-1]} <= chosen and id(convs[-1]) not in chosen
    rounded = [op for op in convs if bf16.bf16_exact(op)]
    assert len(rounded) >= 2 * blocks - 1
    assert all(any(i >= 2 for u in op.result.uses for i, v in enumerate(u.operands) if v is op.result)
               for op in rounded)
    assert any(op.name == "cuvil.slice" and id(op) in chosen for op in ops)  # the projection's subsampling
    in_place = [op for op in convs if any(v.defining_op is not None and
                                          v.defining_op.attrs.get("arena_offset") == op.attrs.get("arena_offset")
                                          for v in op.operands[2:])]
    assert bool(in_place) == over
    (got,), n = _run(module, x, monkeypatch, True, bits)
    assert n == len(chosen)
    (plain,), none = _run(module, x, monkeypatch, False, bits)
    assert none == 0
    np.testing.assert_array_equal(got, plain)
    ref = interpreter.run(module, [x])[0]
    assert float(np.abs(got - ref).max()) <= 1e-3 * float(np.abs(ref).max())
    want = model(torch.from_numpy(x)).detach().numpy()
    assert float(np.abs(got - want).max()) <= 3e-2 * float(np.abs(want).max())


class _Pooled(nn.Module):
    """A residual block whose sum is also pooled (read by no conv): it stays f32, and so
    does the residual it was computed over in place."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.a, self.b, self.c = nn.Conv2d(16, 64, 1), nn.Conv2d(64, 32, 3, padding=1), nn.Conv2d(32, 64, 1)

    def forward(self, x):
        y = torch.relu(self.a(x))
        z = torch.relu(self.c(torch.relu(self.b(y))) + y)
        return z.mean((2, 3))


def test_a_sum_read_by_no_conv_stays_f32_with_its_residual(monkeypatch):
    x = torch.randn(1, 16, 32, 32, generator=torch.Generator().manual_seed(6)).numpy()
    module = _planned(_Pooled().eval(), x, 512)
    a, b, c = [op for op in module.main.body.ops if op.name == "cuvil.conv2d"]
    assert bf16.bf16_exact(a) and not bf16.bf16_exact(c)   # a's result: b's input, c's residual
    assert a.attrs["arena_offset"] == c.attrs["arena_offset"]       # c writes over it
    ops, outs = module.main.body.ops, {id(v) for v in module.main.outputs}
    assert bf16.writes_pairs(a, DPBF16, 16) and bf16.stored_pairs(ops, outs, DPBF16, 16) == {id(b)}
    (got,), _ = _run(module, x, monkeypatch, True)
    ref = interpreter.run(module, [x])[0]
    assert float(np.abs(got - ref).max()) <= 1e-4 * float(np.abs(ref).max())


def test_a_result_read_by_a_conv_and_elsewhere_is_not_rounded():
    x = torch.randn(1, 16, 32, 32)
    module = quantized(_to_ir(_Pooled().eval(), (x,)), "none", precision="bf16")
    a, b, c = [op for op in module.main.body.ops if op.name == "cuvil.conv2d"]
    assert [s[0] for s in a.attrs["post"]][-1] == "fake_quant" and a.attrs["post"][-1][2] == {"dtype": "bf16"}
    assert all(s[0] != "fake_quant" for op in (b, c) for s in op.attrs["post"])
    module = quantized(_to_ir(_Chain(16, 32, 16, 1).eval(), (x,)), "none", precision="bf16")
    # inputs only: the convs round them anyway, nothing to state
    assert not any(bf16.bf16_exact(op) for op in module.main.body.ops if op.name == "cuvil.conv2d")


def test_rounding_to_bf16_matches_the_reference_bit_for_bit():
    """fake_quant {dtype: bf16} compiled (a vector loop, a scalar tail) against
    quant.bf16_round: ties to even, carries into the exponent, infinities, NaNs,
    subnormals and values that overflow to infinity."""
    bits = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F7FFFFF, 0x7F7FFFFF, 0x7F800000, 0xFF800000,
                     0x7FC00001, 0x7F800001, 0x00008000, 0x00018000, 0x80000001, 0x00000000, 0x80000000,
                     0x7F7F8000, 0x3EAAAAAB, 0xBF2AAAAB], dtype=np.uint32)
    rng = np.random.default_rng(7)
    x = np.concatenate([bits.view(np.float32), rng.standard_normal(30).astype(np.float32) * 1e3])
    text = f'''func @main(%0: tensor<[{x.size}], f32> "x") -> ("y") {{
  %1 = cuvil.fake_quant(%0) {{dtype = "bf16"}} : tensor<[{x.size}], f32>
  cuvil.return(%1)
}}
'''
    got = cuvil.compile(parse_module(text), ())(x)[0]
    want = bf16_round(x)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    np.testing.assert_array_equal(got[keep].view(np.uint32), want[keep].view(np.uint32))


class _Stem(nn.Module):
    """A stem conv (no ReLU: negative values too), a max pool (3x3 stride 2, padded:
    clamped borders) and 1x1 / 3x3 convs reading the pool's result: the stem's result
    and the pool's are pairs (the pool maxes the codes' values apart)."""

    def __init__(self, relu):
        super().__init__()
        torch.manual_seed(11)
        self.stem, self.pool = nn.Conv2d(3, 32, 5, 2, 2), nn.MaxPool2d(3, 2, 1)
        self.a, self.b = nn.Conv2d(32, 16, 1), nn.Conv2d(32, 16, 3, padding=1)
        self.relu = relu

    def forward(self, x):
        y = self.stem(x)
        y = self.pool(torch.relu(y) if self.relu else y)
        return self.a(y) + self.b(y)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape", [(1, 3, 64, 64), (2, 3, 63, 49)])   # pooled 32x32, 32x25 (odd)
def test_a_max_pool_passes_pairs_on(relu, shape, monkeypatch):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(12)).numpy()
    model = _Stem(relu).eval()
    module = quantized(_to_ir(model, (torch.from_numpy(x),)), "none", precision="bf16")
    ops, outs = module.main.body.ops, {id(v) for v in module.main.outputs}
    pool = next(op for op in ops if op.name == "cuvil.max_pool2d")
    stem = pool.operands[0].defining_op
    assert {id(pool), id(stem)} <= bf16.stored_pairs(ops, outs, DPBF16, 16)
    (got,), _ = _run(module, x, monkeypatch, True)
    (plain,), none = _run(module, x, monkeypatch, False)
    assert none == 0
    np.testing.assert_array_equal(got, plain)
    want = model(torch.from_numpy(x)).detach().numpy()
    assert float(np.abs(got - want).max()) <= 3e-2 * float(np.abs(want).max())
