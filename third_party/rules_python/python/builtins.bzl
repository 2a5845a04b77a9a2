"""Bazel 4.2.3's built-in Python providers, under names that defs.bzl can re-export
(a .bzl file cannot bind a global of the same name as the built-in it reads)."""

builtin_py_info = PyInfo
builtin_py_runtime_info = PyRuntimeInfo
