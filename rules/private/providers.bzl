"""Providers of the Cuvil rules. Public through //rules:defs.bzl."""

CuvilToolchainInfo = provider(
    doc = "What the compile stage generates code for: one per target platform " +
          "(cuvil_toolchain, resolved through //toolchains:toolchain_type).",
    fields = {
        "target": "The target name `cuvil compile --target` takes (`x86_64-linux-gnu`, " +
                  "`aarch64-linux-gnu`, `wasm32-wasi`). The only way the target reaches " +
                  "the compile action.",
        "llvm_triple": "The LLVM triple the compiler emits for that target " +
                       "(e.g. `aarch64-unknown-linux-gnu`); the compile action checks " +
                       "the manifest against it.",
        "cpu": "LLVM CPU name (`--cpu`), e.g. `x86-64-v3`, `generic`.",
        "features": "LLVM feature string (`--features`), e.g. `+neon`.",
        "linker": "The C compiler driver that links artifacts for this target outside " +
                  "Bazel (`CC=... cuvil link`). Inside Bazel the resolved C toolchain links.",
    },
)

CuvilCaptureInfo = provider(
    doc = "A captured model (the capture stage's output).",
    fields = {
        "cvir": "File: the `.cvir` bundle (IR text + weights, framework-free).",
        "config": "File: the Cuvil config the model was captured with.",
    },
)

CuvilModelInfo = provider(
    doc = "A model compiled for one target platform (the compile stage's outputs).",
    fields = {
        "header": "File: `<name>.h`, the model's C API (prefix: the config's model.name).",
        "object": "File: the model's code (`<name>.o`).",
        "weights_object": "File: the weights as read-only data (`<name>.weights.o`).",
        "manifest": "File: `<name>.json` (inputs, outputs, arena size, target).",
        "api_glue": "File: C source that defines the header's API (libraries).",
        "app_glue": "File: C source that defines the API and the executable's " +
                    "pre/post-processing tables (`cuvil_main_app`; executables only).",
        "cvir": "File: the captured bundle the objects were compiled from.",
        "target": "The Cuvil target name the objects were compiled for.",
        "llvm_triple": "The LLVM triple of the objects.",
        "quantization": "The quantization method the objects were compiled with.",
    },
)
