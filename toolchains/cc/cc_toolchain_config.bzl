"""`cross_cc_toolchain_config`: the C/C++ toolchain configuration of one cross
compiler found on the machine by absolute path (Debian packages), for the target
platforms Cuvil builds for that the host's auto-configured toolchain cannot:

- aarch64 Linux: gcc-aarch64-linux-gnu / g++-aarch64-linux-gnu, libc6-dev-arm64-cross;
- wasm32-wasi: clang-14 + wasm-ld-14 + llvm-ar-14 with wasi-libc (C only; C++ needs
  libc++-14-dev-wasm32 and libc++abi-14-dev-wasm32).

Bazel's legacy features supply the usual include, define, output and linker-input
flags; this adds the target's compile and link flags and the system include
directories for header checking.
"""

load("@bazel_tools//tools/build_defs/cc:action_names.bzl", "ACTION_NAMES")
load(
    "@bazel_tools//tools/cpp:cc_toolchain_config_lib.bzl",
    "feature",
    "flag_group",
    "flag_set",
    "tool_path",
)

_COMPILE_ACTIONS = [
    ACTION_NAMES.assemble,
    ACTION_NAMES.preprocess_assemble,
    ACTION_NAMES.c_compile,
    ACTION_NAMES.cpp_compile,
    ACTION_NAMES.cpp_header_parsing,
    ACTION_NAMES.cpp_module_compile,
]

_LINK_ACTIONS = [
    ACTION_NAMES.cpp_link_executable,
    ACTION_NAMES.cpp_link_dynamic_library,
    ACTION_NAMES.cpp_link_nodeps_dynamic_library,
]

def _flags_feature(name, actions, flags):
    return feature(
        name = name,
        enabled = True,
        flag_sets = [flag_set(actions = actions, flag_groups = [flag_group(flags = flags)])] if flags else [],
    )

def _cross_cc_toolchain_config_impl(ctx):
    tools = {
        "gcc": ctx.attr.cc,
        "cpp": ctx.attr.cpp,
        "ld": ctx.attr.ld,
        "ar": ctx.attr.ar,
        "nm": ctx.attr.nm,
        "objdump": ctx.attr.objdump,
        "objcopy": ctx.attr.objcopy,
        "strip": ctx.attr.strip,
        "gcov": "/bin/false",
        "dwp": "/bin/false",
    }
    features = [
        _flags_feature("cuvil_target_compile_flags", _COMPILE_ACTIONS, ctx.attr.compile_flags),
        _flags_feature("cuvil_target_link_flags", _LINK_ACTIONS, ctx.attr.link_flags),
        feature(name = "supports_pic", enabled = ctx.attr.supports_pic),
        feature(name = "supports_dynamic_linker", enabled = ctx.attr.supports_pic),
        feature(name = "opt"),
        feature(name = "dbg"),
        feature(name = "fastbuild"),
    ]
    return cc_common.create_cc_toolchain_config_info(
        ctx = ctx,
        toolchain_identifier = ctx.attr.toolchain_identifier,
        host_system_name = "x86_64-unknown-linux-gnu",
        target_system_name = ctx.attr.target_system_name,
        target_cpu = ctx.attr.target_cpu,
        target_libc = ctx.attr.target_libc,
        compiler = ctx.attr.compiler,
        abi_version = "local",
        abi_libc_version = "local",
        tool_paths = [tool_path(name = k, path = v) for k, v in tools.items()],
        cxx_builtin_include_directories = ctx.attr.builtin_include_directories,
        features = features,
    )

cross_cc_toolchain_config = rule(
    implementation = _cross_cc_toolchain_config_impl,
    attrs = {
        "toolchain_identifier": attr.string(mandatory = True),
        "target_system_name": attr.string(mandatory = True, doc = "e.g. aarch64-linux-gnu"),
        "target_cpu": attr.string(mandatory = True, doc = "Bazel's cpu name, e.g. aarch64, wasm32"),
        "target_libc": attr.string(default = "glibc"),
        "compiler": attr.string(default = "gcc"),
        "cc": attr.string(mandatory = True, doc = "absolute path of the compiler driver (also links)"),
        "cpp": attr.string(default = "/usr/bin/cpp"),
        "ld": attr.string(mandatory = True),
        "ar": attr.string(mandatory = True),
        "nm": attr.string(default = "/usr/bin/nm"),
        "objdump": attr.string(default = "/usr/bin/objdump"),
        "objcopy": attr.string(default = "/usr/bin/objcopy"),
        "strip": attr.string(default = "/usr/bin/strip"),
        "compile_flags": attr.string_list(),
        "link_flags": attr.string_list(),
        "supports_pic": attr.bool(default = True),
        "builtin_include_directories": attr.string_list(),
    },
    provides = [CcToolchainConfigInfo],
)
