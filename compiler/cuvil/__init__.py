"""Cuvil: an ahead-of-time compiler from PyTorch models to native code.

    model = cuvil.compile(torch_module, example_inputs)
    (y,) = model(x_numpy)
"""
from .api import CompiledModel, capture, compile, load_ir
from .errors import CuvilError

__all__ = ["CompiledModel", "CuvilError", "capture", "compile", "load_ir"]
__version__ = "0.1.0"
