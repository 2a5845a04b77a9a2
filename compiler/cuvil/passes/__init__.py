"""Compile-stage passes, one per file, and the pipeline that orders them (pipeline.py).

A pass is a frozen dataclass with a kebab-case `name` and `apply(module) -> None` that
rewrites the module in place and leaves it valid for `cuvil.ir.verify`; its fields are
its options.
"""
from .canonicalize import Canonicalize
from .constant_fold import ConstantFold
from .dce import DeadCodeElimination
from .fold_batch_norm import FoldBatchNorm
from .fuse_attention import FuseAttention
from .fuse_elementwise import FuseElementwise
from .fuse_epilogues import FuseEpilogues
from .infer_shapes import InferShapes
from .memory_plan import MemoryPlan, check_plan
from .pipeline import Pass, default_pipeline, run_pipeline

__all__ = ["Pass", "InferShapes", "Canonicalize", "ConstantFold", "FoldBatchNorm", "DeadCodeElimination",
           "FuseEpilogues", "FuseElementwise", "FuseAttention", "MemoryPlan", "check_plan", "default_pipeline",
           "run_pipeline"]
