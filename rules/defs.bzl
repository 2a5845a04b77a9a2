"""Public Bazel API of Cuvil. Implementation: //rules/private.

    load("@cuvil//rules:defs.bzl", "cuvil_model", "cuvil_binary")

    cuvil_model(name, model, config, quantization = None, plugins = [], data = [], calibration = [],
                precision = None, ...)
        a cc_library of the compiled model (+ `<name>_main`, `<name>_capture`,
        `<name>_compile`, ...; see its docstring)
    cuvil_binary(name, model, platform = None, quantization = None, ...)
        a standalone executable, optionally for another platform (no flags needed)
    cuvil_toolchain(name, target, llvm_triple, llvm_cpu, llvm_features, linker)
        one Cuvil target, registered with toolchain(toolchain_type =
        "@cuvil//toolchains:toolchain_type")

Providers: CuvilModelInfo (the compile stage's files and target), CuvilCaptureInfo
(the .cvir), CuvilToolchainInfo (triple, cpu, features, linker).
Build settings: --@cuvil//cuvil:quantization=none|fp16|int8_sym|int4_block,
--@cuvil//cuvil:precision=f32|bf16.
"""

load("//rules/private:binary.bzl", _cuvil_binary = "cuvil_binary", _cuvil_platform_binary = "cuvil_platform_binary")
load(
    "//rules/private:model.bzl",
    _PRECISIONS = "PRECISIONS",
    _QUANTIZATIONS = "QUANTIZATIONS",
    _cuvil_c_deps = "cuvil_c_deps",
    _cuvil_capture = "cuvil_capture",
    _cuvil_compile = "cuvil_compile",
    _cuvil_model = "cuvil_model",
)
load(
    "//rules/private:providers.bzl",
    _CuvilCaptureInfo = "CuvilCaptureInfo",
    _CuvilModelInfo = "CuvilModelInfo",
    _CuvilToolchainInfo = "CuvilToolchainInfo",
)
load("//rules/private:toolchain.bzl", _cuvil_toolchain = "cuvil_toolchain")

cuvil_model = _cuvil_model
cuvil_binary = _cuvil_binary
cuvil_toolchain = _cuvil_toolchain

# The rules behind the macros, for custom macros.
cuvil_capture = _cuvil_capture
cuvil_compile = _cuvil_compile
cuvil_c_deps = _cuvil_c_deps
cuvil_platform_binary = _cuvil_platform_binary

CuvilModelInfo = _CuvilModelInfo
CuvilCaptureInfo = _CuvilCaptureInfo
CuvilToolchainInfo = _CuvilToolchainInfo

QUANTIZATIONS = _QUANTIZATIONS
PRECISIONS = _PRECISIONS
