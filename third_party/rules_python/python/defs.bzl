"""Offline stand-in for @rules_python//python:defs.bzl: Bazel 4.2.3's native Python
rules and providers, under the names the real rules_python exports."""

load("@bazel_tools//tools/python:toolchain.bzl", _py_runtime_pair = "py_runtime_pair")
load(":builtins.bzl", "builtin_py_info", "builtin_py_runtime_info")

PyInfo = builtin_py_info
PyRuntimeInfo = builtin_py_runtime_info
py_binary = native.py_binary
py_library = native.py_library
py_runtime = native.py_runtime
py_runtime_pair = _py_runtime_pair
py_test = native.py_test
