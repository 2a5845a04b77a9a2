"""Toolchain type labels, in a file that toolchain registrations load cheaply.
(Label() resolves against this repository, also when Cuvil is an external one.)"""

CUVIL_TOOLCHAIN_TYPE = str(Label("//toolchains:toolchain_type"))
CC_TOOLCHAIN_TYPE = "@bazel_tools//tools/cpp:toolchain_type"
PYTHON_TOOLCHAIN_TYPE = "@bazel_tools//tools/python:toolchain_type"
