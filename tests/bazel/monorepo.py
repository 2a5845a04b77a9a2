"""An external monorepo that uses Cuvil, made from the README's own snippets.

The README's code blocks whose first line is `# <path>` (WORKSPACE, .bazelrc,
models/resnet50.yaml, models/BUILD.bazel) are written to <path> with the checkout's
location for `/path/to/cuvil`, so the documentation cannot drift from what is tested.
What the README leaves to the user is written here: the model's source (Cuvil's
plain-PyTorch ResNet-50), a C++ app, and two packages that must fail (an unsupported
op, a config without inputs).
"""
from __future__ import annotations

import re
from pathlib import Path

from bazel_helpers import REPO

README = REPO / "README.md"
SIDE = 224
CLASSES = 1000


def readme_files() -> dict[str, str]:
    """{path: text} of the README's code blocks that start with `# <path>`."""
    files = {}
    for block in re.findall(r"^```\w*\n(.*?)^```", README.read_text(), re.S | re.M):
        first = block.splitlines()[0]
        m = re.fullmatch(r"# ([\w.][\w./-]*)", first.strip())
        if m:
            files[m.group(1)] = block.replace("/path/to/cuvil", str(REPO))
    return files


def _resnet50_source() -> str:
    """examples/models/resnet.py as a stand-alone module (its one relative import inlined)."""
    text = (REPO / "examples" / "models" / "resnet.py").read_text()
    inline = ("def image_batch(batch, size, seed):\n"
              "    g = torch.Generator().manual_seed(seed)\n"
              "    return (torch.rand(batch, 3, size, size, generator=g) * 2 - 1,)\n")
    assert "from . import image_batch\n" in text, "examples/models/resnet.py changed its imports"
    return text.replace("from . import image_batch\n", inline)


_APP = r"""// Reads a float32 [1, 3, 224, 224] image, writes the 1000 logits (float32).
#include <cstdio>
#include <vector>

#include "models/resnet50.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  std::vector<float> image(3 * 224 * 224), logits(1000);
  std::FILE* in = std::fopen(argv[1], "rb");
  if (!in || std::fread(image.data(), sizeof(float), image.size(), in) != image.size()) return 3;
  std::fclose(in);
  cuvil_ctx* ctx = nullptr;
  if (resnet50_create(&ctx) != CUVIL_OK) return 4;
  const void* inputs[] = {image.data()};
  void* outputs[] = {logits.data()};
  cuvil_status st = resnet50_run(ctx, inputs, outputs);
  resnet50_destroy(ctx);
  if (st != CUVIL_OK) {
    std::fprintf(stderr, "app: %s\n", cuvil_last_error());
    return 5;
  }
  std::FILE* out = std::fopen(argv[2], "wb");
  if (!out || std::fwrite(logits.data(), sizeof(float), logits.size(), out) != logits.size()) return 6;
  return std::fclose(out) == 0 ? 0 : 6;
}
"""

# A model whose line 8 calls an op that no Cuvil frontend lowers: a custom op of this
# workspace's own (a built-in op may become supported one day).
_UNSUPPORTED = """\
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        # the next line is line 8
        return mystery(y)


@torch.library.custom_op("monorepo::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    # an op only this workspace defines: no Cuvil frontend lowers it
    return x.clone()


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


def cuvil_entry():
    return Model().eval(), (torch.ones(1, 4),)
"""

_ERRS_BUILD = """\
load("@cuvil//rules:defs.bzl", "cuvil_model")
load("@rules_python//python:defs.bzl", "py_library")

py_library(name = "unsup_src", srcs = ["unsup.py"])

cuvil_model(name = "unsup", model = ":unsup_src", config = "unsup.yaml", tags = ["manual"])

cuvil_model(name = "noinputs", model = ":unsup_src", config = "noinputs.yaml", tags = ["manual"])
"""


def make_monorepo(root: Path) -> Path:
    """Writes the workspace under `root` and returns it."""
    files = readme_files()
    for needed in ("WORKSPACE", ".bazelrc", "models/BUILD.bazel", "models/resnet50.yaml"):
        assert needed in files, f"README.md has no code block starting with '# {needed}'"
    files["models/resnet50.py"] = _resnet50_source()
    files["models/app.cc"] = _APP
    files["errs/BUILD.bazel"] = _ERRS_BUILD
    files["errs/unsup.py"] = _UNSUPPORTED
    files["errs/unsup.yaml"] = ("model: {framework: pytorch, source: unsup.py, entry: cuvil_entry}\n"
                                "inputs: [{name: x, shape: [1, 4], dtype: f32}]\n")
    files["errs/noinputs.yaml"] = "model: {framework: pytorch, source: unsup.py, entry: cuvil_entry}\n"
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root
