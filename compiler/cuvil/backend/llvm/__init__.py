"""LLVM back end: target machines, loops, float math, weights blobs, linking."""
