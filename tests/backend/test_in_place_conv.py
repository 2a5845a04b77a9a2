"""Convs that write their result over the residual their epilogue adds (a kernel plan's
`in_place`, select.residual_in_place): planned only where the kernel at the target's
vector width reads each residual value before storing over it, checked again by the
code generator."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from cuvil.api import _to_ir
from cuvil.backend.llvm.codegen import generate
from cuvil.backend.llvm.select import KernelTarget, kernel_passes, residual_in_place
from cuvil.errors import CuvilError
from cuvil.ir import interpreter
from cuvil.passes.memory_plan import check_plan
from cuvil.passes.pipeline import default_pipeline, run_pipeline
from tests.quant.helpers import run_native


class _Bottleneck(nn.Module):
    """ResNet's bottleneck end: a 1x1 conv whose epilogue adds the block's input (read by
    nothing after it), then ReLU; another conv reads the sum."""

    def __init__(self, c=32, mid=16):
        super().__init__()
        torch.manual_seed(c + mid)
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.reduce, self.expand = nn.Conv2d(c, mid, 1), nn.Conv2d(mid, c, 1)
        self.head = nn.Conv2d(c, 4, 1)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        y = torch.relu(self.expand(torch.relu(self.reduce(h))) + h)
        return self.head(y)


def _planned(model, x, precision, vector_bits, in_place=True):
    """The module planned for vectors of vector_bits (without any result written over an
    operand where not `in_place`)."""
    module = _to_ir(model, (x,))
    run_pipeline(module, default_pipeline(**kernel_passes(KernelTarget(vector_bits // 32)),
                                          memory_plan={"in_place": in_place},
                                          quantize_weights={"method": "none", "precision": precision}))
    check_plan(module.main)
    return module


def _in_place(module):
    return [op for op in module.main.body.ops if op.name == "cuvil.conv2d" and "arena_offset" in op.attrs and any(
        v.defining_op is not None and v.defining_op.attrs.get("arena_offset") == op.attrs["arena_offset"]
        for v in op.operands[2:])]


@pytest.mark.parametrize("precision", ["f32", "bf16"])
@pytest.mark.parametrize("bits", [256, 512])
def test_a_residual_conv_writes_over_its_residual_and_matches_the_interpreter(precision, bits):
    x = torch.randn(1, 3, 32, 40, generator=torch.Generator().manual_seed(1))   # 1280 pixels: whole panels
    module = _planned(_Bottleneck().eval(), x, precision, bits)
    # 256-bit vectors run narrow convs K-blocked (partial sums stored first): not in place
    assert len(_in_place(module)) == (1 if bits == 512 else 0)
    ref = interpreter.run(module, [x.numpy()])[0]
    got = run_native(module, [x.numpy()], bits)[0]
    assert float(np.abs(got - ref).max()) <= 1e-5 * float(np.abs(ref).max())
    plain = _planned(_Bottleneck().eval(), x, precision, bits, in_place=False)
    assert not _in_place(plain)
    np.testing.assert_array_equal(run_native(plain, [x.numpy()], bits)[0], got)


def test_ragged_panels_keep_the_residual_apart():
    """31 x 40 pixels leave a ragged last panel, whose columns are stored before their
    epilogue runs: that conv must not write over its residual."""
    x = torch.randn(1, 3, 31, 40, generator=torch.Generator().manual_seed(2))
    module = _planned(_Bottleneck().eval(), x, "f32", 512)
    assert not _in_place(module)
    conv = [op for op in module.main.body.ops if op.name == "cuvil.conv2d" and len(op.operands) > 3]
    assert conv and not residual_in_place(conv[0], 16)


class _OwnInput(nn.Module):
    """y = x + conv1x1(x): the residual is the conv's own input, read at every pixel."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.stem, self.conv, self.head = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 1), nn.Conv2d(16, 4, 1)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        return self.head(h + self.conv(h))


def test_a_conv_does_not_write_over_its_own_input():
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    module = _planned(_OwnInput().eval(), x, "f32", 512)
    assert not _in_place(module)
    ref = interpreter.run(module, [x.numpy()])[0]
    got = run_native(module, [x.numpy()], 512)[0]
    assert float(np.abs(got - ref).max()) <= 1e-5 * float(np.abs(ref).max())


def test_the_plan_says_which_convs_may_write_over_their_residual():
    x = torch.randn(1, 3, 32, 40, generator=torch.Generator().manual_seed(3))
    for bits, placed in ((512, 1), (256, 0)):
        module = _planned(_Bottleneck().eval(), x, "f32", bits)
        may = [op for op in module.main.body.ops if (op.attrs.get("kernel_plan") or {}).get("in_place")]
        # the memory plan writes over a residual only where the plan allows it (at 256 bits
        # the bottleneck's narrow expand conv runs K-blocked, which cannot)
        assert len(_in_place(module)) == placed and all(op in may for op in _in_place(module))


def test_a_residual_written_over_without_the_plan_is_a_clear_error():
    x = torch.randn(1, 3, 32, 40, generator=torch.Generator().manual_seed(3))
    module = _planned(_Bottleneck().eval(), x, "f32", 512)
    (conv,) = _in_place(module)
    del conv.attrs["kernel_plan"]["in_place"]
    with pytest.raises(CuvilError, match="planned to write over its residual"):
        generate(module, "ip")
