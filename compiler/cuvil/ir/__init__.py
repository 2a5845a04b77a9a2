"""Cuvil IR: SSA module/function/block/op/value, tensor types, op definitions, text form,
verifier, NumPy interpreter and the .cvir bundle."""
from . import ops  # noqa: F401  (registers every op)
from .builder import Builder
from .bundle import read_bundle, write_bundle
from .core import OP_REGISTRY, Block, Function, Module, Op, Value
from .interpreter import run, run_function
from .parser import parse_module
from .printer import print_module
from .types import TensorType
from .verifier import verify

__all__ = ["Builder", "Block", "Function", "Module", "Op", "OP_REGISTRY", "TensorType", "Value",
           "parse_module", "print_module", "read_bundle", "write_bundle", "run", "run_function", "verify"]
