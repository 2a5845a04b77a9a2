"""What a user sees when a model cannot be captured: an UnsupportedOpError naming the
ATen op and the line of *their* forward() (from the export node's stack trace), or a
FrontendError with the reason, raised by the frontend's own node loop (torch.py) rather
than as a traceback from deep inside a handler."""
from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cuvil.errors import CuvilError, FrontendError, UnsupportedOpError
from cuvil.frontends.torch import capture_torch

THIS_FILE = Path(__file__)


def line_of(marker: str) -> int:
    """The line of this file that ends with `# <- marker`."""
    lines = [i for i, text in enumerate(THIS_FILE.read_text().splitlines(), 1) if text.endswith(f"# <- {marker}")]
    assert len(lines) == 1, f"marker {marker!r} must appear exactly once"
    return lines[0]


class Cummax(nn.Module):
    def forward(self, x):
        y = x * 2
        return torch.cummax(y, 1).values  # <- cummax


class ConvTranspose3d(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3, 2, 1, 1, 1))

    def forward(self, x):
        x = x + 1
        return F.conv_transpose3d(x, self.weight)  # <- conv_transpose3d


class Kthvalue(nn.Module):
    def forward(self, x):
        return torch.kthvalue(x.flatten(1), 2).values  # <- kthvalue


class Rfft(nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()  # <- rfft


class InstanceNormRunningStats(nn.Module):
    def forward(self, x):
        return F.instance_norm(x, torch.zeros(3), torch.ones(3), use_input_stats=False)  # <- running stats


class EluScale(nn.Module):
    def forward(self, x):
        return torch.ops.aten.elu.default(x, 1.0, 1.5)  # <- elu scale


class MedianWithIndices(nn.Module):
    def forward(self, x):
        x = torch.relu(x)
        return x.median(dim=1).values  # <- median.dim


class TrainingDropout(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.1, training=True)  # <- dropout


X4 = torch.ones(1, 3, 4, 4)


@pytest.mark.parametrize("model, x, op, reason, marker", [
    (Cummax(), X4[0], "aten.cummax", "unsupported op", "cummax"),
    (ConvTranspose3d(), X4[:, :, None], "aten.conv_transpose3d", "unsupported op", "conv_transpose3d"),
    (Kthvalue(), X4, "aten.kthvalue", "unsupported op", "kthvalue"),
    (Rfft(), X4[0], "aten.fft_rfft", "unsupported op", "rfft"),
    (MedianWithIndices(), X4[0], "aten.median.dim", "unsupported op", "median.dim"),
    # handlers that refuse an argument value
    (InstanceNormRunningStats(), X4, "aten.instance_norm", "running statistics", "running stats"),
    (EluScale(), X4, "aten.elu", "scale", "elu scale"),
    (TrainingDropout(), X4, "aten.dropout", "train=True", "dropout"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_unsupported_op_names_op_and_user_line(model, x, op, reason, marker):
    with pytest.raises(UnsupportedOpError) as info:
        capture_torch(model, (x,))
    assert isinstance(info.value, CuvilError)
    message = str(info.value)
    assert op in message
    assert reason in message
    assert f"{THIS_FILE.name}:{line_of(marker)} in forward" in message
    # raised by the frontend's node loop, not a traceback from inside a handler
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (Path(last.filename).name, last.name) == ("torch.py", "_lower_node")
    assert info.value.__cause__ is None


class TorchLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose3d(3, 2, 1)

    def forward(self, x):
        x = torch.relu(x)
        return self.conv(x)  # <- nn.ConvTranspose3d


def test_unsupported_op_in_torch_layer_names_op():
    with pytest.raises(UnsupportedOpError, match="aten.conv_transpose3d"):
        capture_torch(TorchLayers(), (X4[:, :, None],))


def test_unsupported_op_in_torch_layer_names_user_line():
    with pytest.raises(UnsupportedOpError) as info:
        capture_torch(TorchLayers(), (X4[:, :, None],))
    assert f"{THIS_FILE.name}:{line_of('nn.ConvTranspose3d')}" in str(info.value)


class DataDependentBranch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


class ScalarInput(nn.Module):
    def forward(self, x, n: int):
        return x * n


class NonTensorOutput(nn.Module):
    def forward(self, x):
        return x, 3


@pytest.mark.parametrize("model, inputs, reason", [
    (DataDependentBranch(), (X4,), "data-dependent"),
    (ScalarInput(), (X4, 3), "only tensor inputs"),
    (NonTensorOutput(), (X4,), "not a tensor"),
    (nn.Identity(), (torch.ones(2, dtype=torch.complex64),), "complex64"),
], ids=["data-dependent-branch", "scalar-input", "non-tensor-output", "complex-input"])
def test_capture_failure_is_frontend_error_with_reason(model, inputs, reason):
    with pytest.raises(FrontendError, match=reason):
        capture_torch(model, inputs)


def test_export_failure_names_export():
    with pytest.raises(FrontendError, match="torch.export.export failed") as info:
        capture_torch(DataDependentBranch(), (X4,))
    assert not isinstance(info.value, UnsupportedOpError)
