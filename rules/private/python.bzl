"""Running the Cuvil compiler (Python) inside an action, hermetically.

The interpreter comes from the resolved Python toolchain: rules_python's hermetic
interpreter under bzlmod (a File), or the local one that the WORKSPACE registers
(`interpreter_path`: .venv or $CUVIL_PYTHON). The compiler runs from its declared
sources (PYTHONPATH is the declared `compiler/` directory, never the editable
install), and `requirements.lock` is an input of every action, so the action key
changes when the compiler's dependencies do. Under bzlmod the dependencies themselves
are declared inputs too (pip.parse); offline they come from the interpreter's
site-packages.
"""

load("@rules_python//python:defs.bzl", "PyInfo")
load(":toolchain_types.bzl", "PYTHON_TOOLCHAIN_TYPE")

# Attributes every rule that runs the compiler needs (merge into its attrs).
PYTHON_ATTRS = {
    "_compiler": attr.label(
        default = Label("//:compiler_srcs"),
        allow_files = True,
        doc = "The compiler's sources: compiler/cuvil/**/*.py, runtime, templates.",
    ),
    "_lock": attr.label(
        default = Label("//:requirements.lock"),
        allow_single_file = True,
        doc = "The pinned Python environment of the compiler.",
    ),
    "_python_deps": attr.label(
        default = Label("//rules/private:compiler_python_deps"),
        providers = [PyInfo],
        doc = "The compiler's Python dependencies (pip.parse under bzlmod; empty offline).",
    ),
}

def _compiler_root(ctx):
    for f in ctx.files._compiler:
        if f.basename == "__init__.py" and f.dirname.endswith("/cuvil") and \
           f.short_path.endswith("compiler/cuvil/__init__.py"):
            return f.dirname[:-len("/cuvil")]
    fail("//:compiler_srcs has no compiler/cuvil/__init__.py")

def _import_path(ctx, imp):
    """A PyInfo import path (runfiles-relative: `<repo>/<dir>`) as an execroot path."""
    repo, _, rest = imp.partition("/")
    if repo == ctx.workspace_name:
        return rest or "."
    return "external/" + imp

def python_runner(ctx):
    """struct(executable, tools, inputs, env) for ctx.actions.run of the compiler."""
    runtime = ctx.toolchains[PYTHON_TOOLCHAIN_TYPE].py3_runtime
    if runtime.interpreter != None:
        executable = runtime.interpreter
        tools = runtime.files
    else:
        executable = runtime.interpreter_path
        tools = depset()
    deps = ctx.attr._python_deps
    path = [_compiler_root(ctx)] + [_import_path(ctx, p) for p in deps[PyInfo].imports.to_list()]
    inputs = depset(
        [ctx.file._lock],
        transitive = [
            depset(ctx.files._compiler),
            deps[PyInfo].transitive_sources,
            deps[DefaultInfo].default_runfiles.files,
        ],
    )
    env = {
        "PYTHONPATH": ":".join(path),
        # No __pycache__ next to the sources; no per-user site-packages; stable hashing.
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONHASHSEED": "0",
    }
    return struct(executable = executable, tools = tools, inputs = inputs, env = env)
