"""LLVM back end: kernel selection, code generation by op family, the GEMMs, target
machines and object emission, weights blobs.
"""
