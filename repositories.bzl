"""Set-up macros for a WORKSPACE that uses Cuvil (Bazel 4.2.3 offline, or current Bazel
with WORKSPACE). Users of bzlmod need none of this: MODULE.bazel does it.

    local_repository(name = "cuvil", path = "/path/to/cuvil")   # or http_archive

    load("@cuvil//:repositories.bzl", "cuvil_dependencies", "cuvil_register_toolchains")

    cuvil_dependencies()

    cuvil_register_toolchains()

cuvil_dependencies() defines, where the workspace has not already defined them, the
repositories the rules load from (@rules_cc, @rules_python, @platforms,
@bazel_skylib, @rules_java, @remote_coverage_tools, @cuvil_pip) and @cuvil_python, the
local interpreter that runs the compiler. cuvil_register_toolchains() registers the
Python toolchain, the Cuvil toolchains (one per target) and the C cross toolchains.
Add `import %workspace%/external/cuvil/cuvil.bazelrc`-style lines for the flags
(see cuvil.bazelrc).
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//toolchains/python:python_configure.bzl", "cuvil_python_configure")

# Where Debian's bazel-platforms, bazel-skylib and bazel-rules-java put their copies.
DEBIAN_BAZEL = "/usr/share/bazel"

def _cuvil_shim_repository_impl(rctx):
    source = rctx.path(rctx.attr._cuvil_workspace).dirname.get_child("third_party").get_child(rctx.attr.shim)
    if not source.exists:
        fail("cuvil: %s is missing from the Cuvil checkout" % source)
    for child in source.readdir():
        rctx.symlink(child, child.basename)

_cuvil_shim_repository = repository_rule(
    implementation = _cuvil_shim_repository_impl,
    attrs = {
        "shim": attr.string(mandatory = True, doc = "The directory under third_party/."),
        "_cuvil_workspace": attr.label(default = Label("//:WORKSPACE")),
    },
    local = True,
    doc = "One of Cuvil's offline shims (third_party/<shim>) as a repository of its own.",
)

def cuvil_dependencies(debian_bazel = DEBIAN_BAZEL):
    """Defines the repositories the Cuvil rules need, unless already defined.

    Args:
      debian_bazel: where Debian's copies of platforms (`tools/platforms`, with
        cpu:wasm32 and os:wasi), skylib (`tools/skylib`) and rules_java
        (`rules/java`) are; define those repositories yourself to use others.
    """
    for shim in ["rules_cc", "rules_python", "cuvil_pip", "remote_coverage_tools"]:
        maybe(_cuvil_shim_repository, name = shim, shim = shim)
    maybe(native.local_repository, name = "platforms", path = debian_bazel + "/tools/platforms")
    maybe(native.local_repository, name = "bazel_skylib", path = debian_bazel + "/tools/skylib")

    # Bazel 4.2.3 asks for it to build anything with a Java rule in its tools; without
    # it the error is a failed download from github.com.
    maybe(native.local_repository, name = "rules_java", path = debian_bazel + "/rules/java")

    # The interpreter that runs the compiler inside actions: $CUVIL_PYTHON, else the
    # Cuvil checkout's .venv, else python3 on PATH; the first one with the compiler's
    # packages, or the build stops saying what to set.
    maybe(cuvil_python_configure, name = "cuvil_python")

def cuvil_register_toolchains():
    """Registers the Python toolchain of @cuvil_python, the Cuvil toolchains (one per
    target platform) and the C cross toolchains (aarch64 Linux, wasm32-wasi).

    The C toolchains are chosen by platform only with
    `--incompatible_enable_cc_toolchain_resolution` (in cuvil.bazelrc).
    """
    native.register_toolchains(
        "@cuvil_python//:toolchain",
        str(Label("//toolchains:all")),
        str(Label("//toolchains/cc:all")),
    )
