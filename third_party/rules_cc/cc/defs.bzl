"""Offline stand-in for @rules_cc//cc:defs.bzl: Bazel 4.2.3's native C/C++ rules.

Only what Cuvil's BUILD files use; under bzlmod the real rules_cc provides the same
names.
"""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
