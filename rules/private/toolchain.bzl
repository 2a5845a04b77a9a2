"""`cuvil_toolchain`: what the compile stage generates code for on one platform."""

load(":providers.bzl", "CuvilToolchainInfo")

_TARGETS = {
    # Cuvil target name -> the LLVM triple the compiler maps it to (TARGET_TRIPLES of
    # compiler/cuvil/backend/llvm/target.py: tests/cli/test_options.py checks they agree).
    "x86_64-linux-gnu": "x86_64-unknown-linux-gnu",
    "aarch64-linux-gnu": "aarch64-unknown-linux-gnu",
    "wasm32-wasi": "wasm32-unknown-wasi",
}

def _cuvil_toolchain_impl(ctx):
    target = ctx.attr.target
    if _TARGETS[target] != ctx.attr.llvm_triple:
        fail("target %s compiles for LLVM triple %s, not %s" % (target, _TARGETS[target], ctx.attr.llvm_triple))
    info = CuvilToolchainInfo(
        target = target,
        llvm_triple = ctx.attr.llvm_triple,
        cpu = ctx.attr.llvm_cpu,
        features = ctx.attr.llvm_features,
        linker = ctx.attr.linker,
    )
    return [platform_common.ToolchainInfo(cuvil = info), info]

cuvil_toolchain = rule(
    implementation = _cuvil_toolchain_impl,
    doc = "One Cuvil target: register it with `toolchain(toolchain_type = " +
          "\"//toolchains:toolchain_type\", target_compatible_with = ...)`.",
    attrs = {
        "target": attr.string(
            mandatory = True,
            values = sorted(_TARGETS.keys()),
            doc = "The name `cuvil compile --target` takes.",
        ),
        "llvm_triple": attr.string(mandatory = True, doc = "The LLVM triple of that target (checked)."),
        "llvm_cpu": attr.string(mandatory = True, doc = "LLVM CPU name (`cuvil compile --cpu`)."),
        "llvm_features": attr.string(
            mandatory = True,
            doc = "LLVM feature string (`cuvil compile --features`), e.g. `+neon`.",
        ),
        "linker": attr.string(mandatory = True, doc = "Default C linker driver outside Bazel."),
    },
    provides = [CuvilToolchainInfo],
)
