"""Cuvil: an ahead-of-time compiler from PyTorch models to native code."""
from .errors import CuvilError

__all__ = ["CuvilError"]
__version__ = "0.1.0"
