"""Compile-stage passes, one per file, and the pipeline that orders them (pipeline.py).

A pass is a frozen dataclass with a kebab-case `name` and `apply(module) -> None` that
rewrites the module in place and leaves it valid for `cuvil.ir.verify`; its fields are
its options.
"""
from typing import Protocol

from ..ir import Module


class Pass(Protocol):
    name: str

    def apply(self, module: Module) -> None: ...


from .canonicalize import Canonicalize  # noqa: E402
from .constant_fold import ConstantFold  # noqa: E402
from .dce import DeadCodeElimination  # noqa: E402
from .fold_batch_norm import FoldBatchNorm  # noqa: E402
from .fuse_attention import FuseAttention  # noqa: E402
from .fuse_elementwise import FuseElementwise  # noqa: E402
from .fuse_epilogues import FuseEpilogues  # noqa: E402
from .infer_shapes import InferShapes  # noqa: E402
from .memory_plan import MemoryPlan, check_plan  # noqa: E402
from .pipeline import default_pipeline, run_pipeline  # noqa: E402

__all__ = ["Pass", "InferShapes", "Canonicalize", "ConstantFold", "FoldBatchNorm", "DeadCodeElimination",
           "FuseEpilogues", "FuseElementwise", "FuseAttention", "MemoryPlan", "check_plan", "default_pipeline",
           "run_pipeline"]
