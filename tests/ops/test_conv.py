"""Convolution against torch: stride, padding (numbers and strings), dilation, groups
including depthwise, conv1d, and hypothesis over the whole geometry."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from tests.ops.checks import check_torch, op_names, seeded

ATOL, RTOL = 1e-5, 1e-4  # float32 dot products of up to a few hundred terms


def conv(cin, cout, k, seed=0, **kw) -> nn.Conv2d:
    torch.manual_seed(seed)
    return nn.Conv2d(cin, cout, k, **kw)


@pytest.mark.parametrize("module, shape", [
    (conv(3, 4, 3), (1, 3, 8, 8)),
    (conv(3, 4, 3, padding=1), (2, 3, 7, 9)),
    (conv(3, 4, 3, stride=2, padding=1), (1, 3, 9, 8)),
    (conv(3, 4, (3, 5), stride=(2, 1), padding=(1, 2)), (1, 3, 9, 10)),
    (conv(3, 4, 3, dilation=2, padding=2), (1, 3, 9, 9)),
    (conv(3, 4, 3, dilation=(1, 3), padding=(0, 3)), (1, 3, 8, 11)),
    (conv(4, 6, 3, groups=2, padding=1), (1, 4, 6, 6)),
    (conv(6, 6, 3, groups=6, padding=1), (1, 6, 7, 7)),              # depthwise
    (conv(4, 8, 3, groups=4, stride=2, padding=1), (2, 4, 8, 8)),    # depthwise, multiplier 2
    (conv(4, 5, 1), (1, 4, 5, 5)),                                   # pointwise
    (conv(3, 4, 3, bias=False), (1, 3, 6, 6)),
    (conv(3, 4, 3, padding="same"), (1, 3, 6, 7)),
    (conv(3, 4, 4, padding="same", dilation=2), (1, 3, 9, 8)),       # uneven "same" padding
    (conv(3, 4, 3, padding="valid"), (1, 3, 6, 6)),
    (conv(3, 4, 5, stride=3), (1, 3, 5, 5)),                         # kernel = padded input
    # >= 16 panels of output positions: each work item packs its panel, then multiplies
    # it (kernels.FUSED_PACK_PANELS); ragged last panels
    (conv(8, 12, 3, padding=1), (2, 8, 17, 19)),
    (conv(8, 12, 3, stride=2, padding=1), (1, 8, 33, 35)),
    (conv(8, 16, 7, stride=2, padding=3), (1, 8, 40, 38)),
    (conv(8, 12, 3, groups=2, padding=(0, 1)), (1, 8, 19, 18)),
    (conv(16, 8, 1), (1, 16, 20, 21)),                               # pointwise, packed by vectors
    (conv(8, 8, 1, stride=2), (1, 8, 35, 33)),
    # strided 1x1 convs run as slice + pointwise conv (canonicalize): odd sizes, uneven
    # strides, groups, batch 2, a transposed one (7x7 output planes of 64 channels)
    (conv(16, 24, 1, stride=(2, 3)), (2, 16, 21, 20)),
    (conv(12, 16, 1, stride=3, groups=2), (1, 12, 17, 19)),
    (conv(64, 64, 1, stride=2), (1, 64, 14, 14)),
    (conv(6, 8, (1, 5), stride=(1, 3), padding=(0, 2)), (1, 6, 30, 40)),
    # dilation 1 packs from a zero-padded copy of the input (split by column phase for
    # strides > 1): rows narrower than a vector (a vector's lanes span up to 4 output
    # rows), uneven pads and strides, many panels, groups
    (conv(8, 12, 3, padding=1), (2, 8, 5, 3)),
    (conv(8, 12, 3, stride=(2, 3), padding=(1, 0)), (2, 8, 23, 10)),
    (conv(8, 12, (3, 5), padding=(2, 1)), (1, 8, 41, 9)),
    (conv(8, 12, 3, groups=2, padding=(1, 0)), (2, 8, 30, 12)),
    # rows of whole vectors (output widths 16 and 32): one load per vector and tap, lanes
    # past the last column masked only where the last panel is ragged
    (conv(8, 12, 3, padding=1), (1, 8, 19, 16)),
    (conv(8, 12, 3, stride=2, padding=1), (2, 8, 40, 64)),
    (conv(3, 16, 7, stride=2, padding=3), (1, 3, 38, 64)),
    # the padded copy in bands of rows (few planes), phases split from one masked load
    # of stride x vector-width columns, edges inside and outside that load
    (conv(2, 8, 5, stride=3, padding=(2, 4)), (1, 2, 23, 50)),
    (conv(4, 8, 3, stride=(1, 2), padding=(1, 1)), (2, 4, 9, 17)),
])
def test_conv2d(module, shape):
    check_torch(module, seeded(1, *shape), atol=ATOL, rtol=RTOL)


class ConvBlock(nn.Module):
    """conv -> (residual) -> activation: the post program runs on each GEMM tile's
    accumulators (whole vectors: bias per row, residual per element) or after the tile."""

    def __init__(self, act, residual: bool, cin=8, cout=8):
        super().__init__()
        torch.manual_seed(3)
        self.conv, self.act, self.residual = nn.Conv2d(cin, cout, 3, padding=1), act, residual

    def forward(self, x):
        y = self.conv(x)
        return self.act(y + x if self.residual else y)


@pytest.mark.parametrize("act", [nn.ReLU(), nn.ReLU6(), nn.Hardswish(), nn.LeakyReLU(0.1), nn.GELU()],
                         ids=["relu", "relu6", "hardswish", "leaky", "gelu"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hw", [(7, 7), (16, 16)], ids=["transposed", "panels"])
def test_conv_epilogue(act, residual, hw):
    check_torch(ConvBlock(act, residual), seeded(7, 2, 8, *hw), atol=ATOL, rtol=RTOL)


class ConvResidual(nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, x, r):
        return torch.relu(self.conv(x) + r)


@pytest.mark.parametrize("module, shape", [
    (conv(64, 48, 3, padding=1), (1, 64, 7, 7)),                       # ResNet's last stage, smaller
    (conv(32, 37, 3, stride=2, padding=1), (2, 32, 14, 14)),           # channels not whole vectors
    (conv(48, 70, 1), (1, 48, 7, 7)),                                   # 1x1: the input is im2col^T
    (conv(48, 64, 1), (2, 48, 7, 7)),                                   # 1x1, whole panels: tiles stored
    (conv(64, 96, 1, bias=False), (1, 64, 14, 14)),                    # transposed from registers
    (conv(40, 64, 1, stride=2), (2, 40, 13, 13)),                      # strided 1x1: packed
    (conv(16, 20, 3, padding=2, dilation=2), (1, 16, 9, 11)),          # dilation: packed per element
    (conv(24, 33, 1), (3, 24, 1, 1)),                                   # one output position
    (conv(24, 32, 3, padding=1, bias=False), (1, 24, 3, 3)),           # fewer positions than a vector
    (conv(12, 18, (3, 5), stride=(2, 1), padding=(1, 2)), (1, 12, 9, 5)),
])
def test_small_output_planes_run_transposed(module, shape):
    """Output planes that fill 512-bit vectors' 32-column panels poorly (select.conv_transposed)
    run as C^T = im2col^T @ W^T with W^T packed, transposed back into NCHW with the
    epilogue; checked against torch on the host, whose narrower panels may take the
    column-panel form for some of them (196 positions fill 16-column panels well)."""
    from cuvil.backend.llvm.select import conv_transposed
    x = seeded(8, *shape)
    with torch.no_grad():
        r = seeded(9, *module(x).shape)
    ir = check_torch(ConvResidual(module), x, r, atol=ATOL, rtol=RTOL)
    (op,) = [op for op in ir.main.body.ops if op.name == "cuvil.conv2d"]
    assert conv_transposed(op, 16)


def test_pointwise_transposed_tiles_stored_from_registers_on_256_bit_vectors():
    """A 1x1 transposed conv of whole channel panels stores its tiles transposed in
    registers with the residual epilogue (kernels.transposed_store) with AVX2's 6-row
    tiles and 16-channel panels too, two images, a short last row block (49 = 8 * 6 + 1)."""
    import numpy as np

    import cuvil
    from cuvil.backend.llvm.target import Target, host_target
    host = host_target()
    if not (host.arch == "x86_64" and host.has_feature("avx2") and host.has_feature("fma")):
        pytest.skip("this host cannot run AVX2 + FMA code")
    model = ConvResidual(conv(40, 48, 1)).eval()
    x, r = seeded(8, 2, 40, 7, 7), seeded(9, 2, 48, 7, 7)
    with torch.no_grad():
        want = model(x, r).numpy()
    avx2 = Target("x86_64-unknown-linux-gnu", "haswell", "+avx,+avx2,+fma,+f16c")
    for threads in (1, 2):
        got = cuvil.compile(model, (x, r), target=avx2, threads=threads)(x.numpy(), r.numpy())[0]
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("module, shape", [
    (conv(24, 40, 3, padding=1), (1, 24, 14, 14)),    # 196 positions: 13 panels of 16
    (conv(64, 30, 1), (1, 64, 12, 12)),               # 1x1, 144 positions: 9 whole panels
    (conv(16, 26, 3, stride=2, padding=1), (2, 16, 23, 25)),   # 12 x 13 per image, two images
])
def test_well_filled_panels_below_the_fused_count(module, shape):
    """Fewer than FUSED_PACK_PANELS panels that fill 16-wide panels well: with 256-bit
    vectors these are not transposed; all panels are packed, then each thread runs its
    range of panels K-blocked (gemm.emit_gemm_blocked), residual and ReLU per tile."""
    from cuvil.backend.llvm.select import conv_transposed
    x = seeded(10, *shape)
    with torch.no_grad():
        r = seeded(11, *module(x).shape)
    ir = check_torch(ConvResidual(module), x, r, atol=ATOL, rtol=RTOL)
    (op,) = [op for op in ir.main.body.ops if op.name == "cuvil.conv2d"]
    assert not conv_transposed(op, 8)


def test_depthwise_lowers_to_one_grouped_conv():
    ir = check_torch(conv(6, 6, 3, groups=6, padding=1, bias=False), seeded(2, 1, 6, 5, 5), atol=ATOL, rtol=RTOL)
    (op,) = [op for op in ir.main.body.ops if op.name == "cuvil.conv2d"]
    assert op.attrs["groups"] == 6


@pytest.mark.parametrize("kw, shape", [
    (dict(kernel_size=3), (2, 3, 10)),
    (dict(kernel_size=3, stride=2, padding=1, dilation=2), (1, 3, 11)),
    (dict(kernel_size=3, groups=3, padding="same"), (1, 3, 9)),
])
def test_conv1d(kw, shape):
    torch.manual_seed(0)
    check_torch(nn.Conv1d(3, 6, **kw), seeded(3, *shape), atol=ATOL, rtol=RTOL)


def test_functional_conv2d_with_weight_inputs():
    """Weights as model inputs rather than parameters: the conv sees two activations."""
    x, w, b = seeded(4, 1, 4, 6, 6), seeded(5, 6, 2, 3, 3), seeded(6, 6)
    ir = check_torch(lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2), x, w, b,
                     atol=ATOL, rtol=RTOL)
    assert "cuvil.conv2d" in op_names(ir)


@st.composite
def conv_geometry(draw):
    groups = draw(st.sampled_from([1, 2, 3]))
    depthwise = draw(st.booleans())
    cin_g = 1 if depthwise else draw(st.integers(1, 3))
    cout_g = draw(st.integers(1, 2))
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    # smallest input the padded, dilated kernel fits in, plus a few
    hw = [max(1, (k[i] - 1) * dilation[i] + 1 - 2 * padding[i]) + draw(st.integers(0, 4)) for i in (0, 1)]
    return dict(groups=groups, cin=cin_g * groups, cout=cout_g * groups, k=k, stride=stride,
                dilation=dilation, padding=padding, batch=draw(st.integers(1, 2)), hw=hw,
                bias=draw(st.booleans()), seed=draw(st.integers(0, 2 ** 16)))


@given(conv_geometry())
def test_conv2d_geometry(g):
    module = conv(g["cin"], g["cout"], g["k"], seed=g["seed"], stride=g["stride"], padding=g["padding"],
                  dilation=g["dilation"], groups=g["groups"], bias=g["bias"])
    check_torch(module, seeded(g["seed"], g["batch"], g["cin"], *g["hw"]), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("budget", [4096, 1 << 19], ids=["many-k-blocks", "default"])
def test_transposed_conv_k_blocks(monkeypatch, budget):
    """The transposed conv's GEMM runs K in blocks (gemm.k_blocks), later blocks adding
    to C^T: a tiny budget splits K = 288 into 5 uneven blocks; a real one keeps 1."""
    from cuvil.backend.llvm import gemm
    monkeypatch.setattr(gemm, "K_BLOCK_BYTES", budget)
    assert gemm.k_blocks(288, 49, 16) == ((5, 58) if budget == 4096 else (1, 288))
    module = conv(32, 40, 3, padding=1)
    x = seeded(10, 1, 32, 7, 7)
    with torch.no_grad():
        r = seeded(11, *module(x).shape)
    check_torch(ConvResidual(module), x, r, atol=ATOL, rtol=RTOL)


class _Pointwise(nn.Module):
    """1x1 convs whose whole panels the GEMM tiles read from the input planes in place
    (kernels.k_conv2d, with tiles of whole vectors; a ragged last panel is packed): >= 16
    panels at 512 bits, groups, a residual epilogue, 5 rows (no K-blocked GEMM at 256)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(12)
        self.c1, self.c2, self.c3 = nn.Conv2d(24, 20, 1), nn.Conv2d(20, 16, 1, groups=2), nn.Conv2d(16, 5, 1)

    def forward(self, x, r):
        z = self.c2(torch.relu(self.c1(x))) + r
        return self.c3(z), z


@pytest.mark.parametrize("vector_bits", [128, 256, 512])
@pytest.mark.parametrize("hw", [(23, 29), (16, 32)], ids=["ragged", "whole-panels"])
def test_pointwise_convs_read_their_input_planes_in_place(vector_bits, hw):
    import numpy as np

    from cuvil.api import _to_ir
    from cuvil.ir import interpreter
    from cuvil.passes.pipeline import default_pipeline, run_pipeline
    from tests.quant.helpers import run_native
    xs = (seeded(13, 2, 24, *hw), seeded(14, 2, 16, *hw))
    module = run_pipeline(_to_ir(_Pointwise(), xs), default_pipeline())
    assert [op.name for op in module.main.body.ops].count("cuvil.conv2d") == 3
    arrays = [x.numpy() for x in xs]
    with torch.no_grad():
        expected = _Pointwise()(*xs)
    for got, ref, want in zip(run_native(module, arrays, vector_bits), interpreter.run(module, arrays), expected):
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)
        np.testing.assert_allclose(got, want.numpy(), atol=ATOL, rtol=RTOL)
