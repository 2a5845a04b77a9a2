"""The C runtime (C99; libc, libm and pthreads only) that Cuvil artifacts link.

    cuvil_runtime.h / .c   tensors, the arena, contexts, error codes and messages
    cuvil_threadpool.c     cuvil_parallel_for, the pool generated code calls
    cuvil_app.h            what an executable's generated glue hands to main
    cuvil_main.c           the executable's command line
    cuvil_npy.c            .npy reading and writing
    cuvil_image.c          JPEG/PNG decoding and image pre-processing
    cuvil_io.c             checked file reads, atomic writes, JSON output
    cuvil_plugin.h         the versioned C ABI of plugin modules (pre/post-processing, custom ops)
    abi.py                 ABI signatures: versions, reading them from objects
    wasi_run.mjs           runs a wasm32-wasi executable under Node's node:wasi

`cuvil.native.link_artifact` compiles these with the model's objects.
"""
from __future__ import annotations

from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parent

# Linked into every artifact (exe, .so, .a).
CORE_SOURCES = ("cuvil_runtime.c", "cuvil_threadpool.c")
# Added for executables. cuvil_image.c needs libjpeg, libpng and zlib unless it is
# compiled with -DCUVIL_NO_CODECS (a model without image inputs).
EXE_SOURCES = ("cuvil_main.c", "cuvil_npy.c", "cuvil_io.c", "cuvil_image.c")
WASI_RUNNER = RUNTIME_DIR / "wasi_run.mjs"
