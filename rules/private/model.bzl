"""cuvil_model: capture (exec configuration) -> compile (per target platform) ->
a cc_library any C/C++ target can depend on."""

load("@bazel_skylib//rules:common_settings.bzl", "BuildSettingInfo")
load("@rules_cc//cc:defs.bzl", "cc_library")
load(":labels.bzl", "sibling_label")
load(":providers.bzl", "CuvilCaptureInfo", "CuvilModelInfo")
load(":python.bzl", "PYTHON_ATTRS", "python_runner")
load(":toolchain_types.bzl", "CUVIL_TOOLCHAIN_TYPE", "PYTHON_TOOLCHAIN_TYPE")

# The lists of compiler/cuvil/options.py (QUANTIZATION_METHODS, PRECISIONS), in its order:
# tests/cli/test_options.py checks that they agree.
QUANTIZATIONS = ["none", "fp16", "int4_block", "int8_sym"]
PRECISIONS = ["f32", "bf16"]

# The configuration the capture stage is built in: one for every target platform and
# quantization, so a model is captured once per build. Current Bazel names exec
# configurations by their content (diff against the baseline), so "exec" does it.
# Bazel 4.2.3 carries the platform transition's output-directory hash into the exec
# configuration (the capture would run again under
# k8-opt-exec-...-ST-<hash>), so there the host configuration (always bazel-out/host)
# is used; current Bazel rejects "host", and has `config.exec`, which 4.2.3 lacks.
CAPTURE_CFG = "exec" if hasattr(config, "exec") else "host"

def _model_sources(target):
    info = target[DefaultInfo]
    return depset(transitive = [info.files, info.default_runfiles.files])

# -- capture ---------------------------------------------------------------------------

def _cuvil_capture_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".cvir")
    py = python_runner(ctx)
    args = ctx.actions.args()
    args.add_all(["-m", "cuvil.cli", "capture"])
    args.add("--config", ctx.file.config)
    args.add("--output", out)
    ctx.actions.run(
        executable = py.executable,
        tools = py.tools,
        arguments = [args],
        inputs = depset(
            [ctx.file.config] + ctx.files.data,
            transitive = [py.inputs, _model_sources(ctx.attr.model)],
        ),
        outputs = [out],
        env = py.env,
        mnemonic = "CuvilCapture",
        progress_message = "Capturing model %s with %s" % (ctx.label, ctx.file.config.short_path),
    )
    return [
        DefaultInfo(files = depset([out])),
        CuvilCaptureInfo(cvir = out, config = ctx.file.config),
    ]

_MODEL_ATTRS = {
    "model": attr.label(
        mandatory = True,
        doc = "The model's Python sources: a py_library or filegroup (its files and " +
              "runfiles are the capture's inputs).",
    ),
    "config": attr.label(
        mandatory = True,
        allow_single_file = [".yaml", ".yml"],
        doc = "The Cuvil config (model entry point, inputs, outputs, pre/post-processing). " +
              "Paths in it are relative to it and must name declared files.",
    ),
    "data": attr.label_list(
        allow_files = True,
        doc = "Other files the config or the model reads (labels, checkpoints).",
    ),
}

cuvil_capture = rule(
    implementation = _cuvil_capture_impl,
    doc = "The capture stage: the model's Python entry point -> `<name>.cvir`. Needs the " +
          "framework (torch). cuvil_model builds it in the exec configuration, once " +
          "for all target platforms and quantizations.",
    attrs = dict(_MODEL_ATTRS, **PYTHON_ATTRS),
    toolchains = [PYTHON_TOOLCHAIN_TYPE],
    provides = [CuvilCaptureInfo],
)

# -- compile ---------------------------------------------------------------------------

def effective_quantization(ctx):
    """The attribute if set, else --@cuvil//cuvil:quantization."""
    q = ctx.attr.quantization or ctx.attr._quantization_flag[BuildSettingInfo].value
    if q not in QUANTIZATIONS:
        fail("quantization '%s' is not a Cuvil quantization method (methods: %s)" % (q, ", ".join(QUANTIZATIONS)))
    return q

def effective_precision(ctx):
    """The attribute if set, else --@cuvil//cuvil:precision."""
    p = ctx.attr.precision or ctx.attr._precision_flag[BuildSettingInfo].value
    if p not in PRECISIONS:
        fail("precision '%s' is not a Cuvil precision (precisions: %s)" % (p, ", ".join(PRECISIONS)))
    return p

def _cuvil_compile_impl(ctx):
    tc = ctx.toolchains[CUVIL_TOOLCHAIN_TYPE].cuvil
    capture = ctx.attr.capture[CuvilCaptureInfo]
    quantization = effective_quantization(ctx)
    precision = effective_precision(ctx)
    base = ctx.attr.model_name or ctx.label.name

    # The compile stage's files go to a directory per quantization and precision
    # (`<name>.<quantization>-<precision>/`), so builds with different flags for one
    # platform keep both results; `<name>.h` and `<name>.json` beside it are symlinks
    # to the current ones (what C code includes and what tools read).
    variant = "%s.%s-%s/%s" % (base, quantization, precision, base)
    header = ctx.actions.declare_file(variant + ".h")
    obj = ctx.actions.declare_file(variant + ".o")
    weights = ctx.actions.declare_file(variant + ".weights.o")
    manifest = ctx.actions.declare_file(variant + ".json")
    api_glue = ctx.actions.declare_file(variant + "_api.c")
    app_glue = ctx.actions.declare_file(variant + "_app.c")
    public_header = ctx.actions.declare_file(base + ".h")
    public_manifest = ctx.actions.declare_file(base + ".json")

    plugin_headers = [p[CcInfo].compilation_context.headers for p in ctx.attr.plugins]
    py = python_runner(ctx)
    args = ctx.actions.args()
    args.add(ctx.file._driver)
    args.add("--bundle", capture.cvir)
    args.add("--config", capture.config)
    args.add("--target", tc.target)
    args.add("--cpu", tc.cpu)
    args.add("--features", tc.features)
    args.add("--quantization", quantization)
    args.add("--precision", precision)

    # Calibration inputs are inputs of the action only where the method reads them, so
    # editing them does not recompile the fp32 or fp16 model.
    calibration = ctx.files.calibration if quantization in ("int8_sym", "int4_block") else []
    args.add_all(calibration, before_each = "--calibration")
    args.add("--llvm-triple", tc.llvm_triple)
    args.add("--header", header)
    args.add("--object", obj)
    args.add("--weights", weights)
    args.add("--manifest", manifest)
    args.add("--api-glue", api_glue)
    args.add("--app-glue", app_glue)
    ctx.actions.run(
        executable = py.executable,
        tools = py.tools,
        arguments = [args],
        inputs = depset(
            [ctx.file._driver, capture.cvir, capture.config] + ctx.files.data + calibration,
            transitive = [py.inputs] + plugin_headers,
        ),
        outputs = [header, obj, weights, manifest, api_glue, app_glue],
        env = py.env,
        mnemonic = "CuvilCompile",
        progress_message = "Compiling model %s for %s (cpu %s, quantization %s, precision %s)" % (
            ctx.label,
            tc.llvm_triple,
            tc.cpu,
            quantization,
            precision,
        ),
    )
    ctx.actions.symlink(output = public_header, target_file = header)
    ctx.actions.symlink(output = public_manifest, target_file = manifest)
    return [
        DefaultInfo(files = depset([public_header, obj, weights, public_manifest])),
        CuvilModelInfo(
            header = public_header,
            object = obj,
            weights_object = weights,
            manifest = public_manifest,
            api_glue = api_glue,
            app_glue = app_glue,
            cvir = capture.cvir,
            target = tc.target,
            llvm_triple = tc.llvm_triple,
            quantization = quantization,
        ),
        OutputGroupInfo(
            header = depset([public_header]),
            # The glue includes "<name>.h" from its own directory: that header goes
            # with the objects (a private header of the cc_library).
            objects = depset([obj, weights, header]),
            manifest = depset([public_manifest]),
            api_glue = depset([api_glue]),
            app_glue = depset([app_glue]),
        ),
    ]

cuvil_compile = rule(
    implementation = _cuvil_compile_impl,
    doc = "The compile stage for the target platform: `.cvir` -> `<model_name>.h`, `.o`, " +
          "`.weights.o`, `.json` and C glue, in `<model_name>.<quantization>-<precision>/` " +
          "(so each quantization keeps its own files), with `<model_name>.h` and " +
          "`<model_name>.json` beside it as symlinks to them. Framework-free. Output " +
          "groups: header, objects, manifest, api_glue, app_glue.",
    attrs = dict(PYTHON_ATTRS, **{
        "capture": attr.label(
            mandatory = True,
            cfg = CAPTURE_CFG,
            providers = [CuvilCaptureInfo],
            doc = "The cuvil_capture target (built in the exec configuration, or the " +
                  "host one on Bazel 4.2.3: once for every platform and quantization).",
        ),
        "model_name": attr.string(doc = "Base name of the outputs (default: the target's name)."),
        "quantization": attr.string(
            doc = "Overrides --@cuvil//cuvil:quantization for this model: none, fp16, " +
                  "int8_sym or int4_block (empty: the flag).",
        ),
        "precision": attr.string(
            doc = "Overrides --@cuvil//cuvil:precision for this model: f32 or bf16 (empty: the flag).",
        ),
        "plugins": attr.label_list(
            providers = [CcInfo],
            doc = "Plugin cc_libraries; their headers are inputs of the compile action.",
        ),
        "calibration": attr.label_list(
            allow_files = [".npy", ".npz", ".jpg", ".jpeg", ".png"],
            doc = "Calibration inputs for int8_sym (and GPTQ-style int4_block): they replace " +
                  "the config's quantization.calibration.files; inputs of the compile " +
                  "action only under those methods.",
        ),
        "data": attr.label_list(allow_files = True, doc = "Files the config reads (labels)."),
        "_driver": attr.label(
            default = Label("//rules/private:compile_model.py"),
            allow_single_file = True,
        ),
        "_quantization_flag": attr.label(default = Label("//cuvil:quantization")),
        "_precision_flag": attr.label(default = Label("//cuvil:precision")),
    }),
    toolchains = [CUVIL_TOOLCHAIN_TYPE, PYTHON_TOOLCHAIN_TYPE],
    provides = [CuvilModelInfo],
)

# -- C libraries that do not depend on the model ----------------------------------------

# Bazel 4.2.3 names a transitioned configuration's output directory (`...-ST-<hash>`)
# after the Starlark build settings a transition changed on the way: below
# cuvil_binary's platform transition, --@cuvil//cuvil:quantization would move the C
# runtime and the plugins to a new directory, with new compile commands, for each
# quantization, although they read neither flag. Two transitions in a row give them
# one configuration whatever the flags are: the first sets both flags to values other
# than their defaults, the second back to the defaults, so the second always changes
# both and the directory's hash always covers the same values. (One transition to the
# defaults would change nothing under the default flags and something under others:
# two directories.)
_QUANTIZATION_FLAG = str(Label("//cuvil:quantization"))
_PRECISION_FLAG = str(Label("//cuvil:precision"))
_FLAGS_AWAY = {_QUANTIZATION_FLAG: "fp16", _PRECISION_FLAG: "bf16"}
_FLAGS_DEFAULT = {_QUANTIZATION_FLAG: "none", _PRECISION_FLAG: "f32"}

def _flags_away_impl(_settings, _attr):
    return dict(_FLAGS_AWAY)

def _flags_default_impl(_settings, _attr):
    return dict(_FLAGS_DEFAULT)

_flags_away = transition(implementation = _flags_away_impl, inputs = [], outputs = list(_FLAGS_AWAY.keys()))
_flags_default = transition(implementation = _flags_default_impl, inputs = [], outputs = list(_FLAGS_DEFAULT.keys()))

def _forward_cc_impl(ctx):
    deps = ctx.attr.deps
    return [
        cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in deps]),
        DefaultInfo(files = depset(transitive = [d[DefaultInfo].files for d in deps])),
    ]

def _forward_cc_rule(cfg, doc):
    return rule(
        implementation = _forward_cc_impl,
        doc = doc,
        attrs = {
            "deps": attr.label_list(providers = [CcInfo], cfg = cfg, doc = "cc_library targets."),
            "_allowlist_function_transition": attr.label(
                default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
            ),
        },
        provides = [CcInfo],
    )

_cc_flags_away = _forward_cc_rule(_flags_away, "`deps` with the Cuvil flags away from their defaults.")
_cc_flags_default = _forward_cc_rule(_flags_default, "`deps` with the Cuvil flags at their defaults.")

def cuvil_c_deps(name, deps, **kwargs):
    """The CcInfo of `deps`, C libraries that read no Cuvil build setting (the runtime,
    plugins), built in one configuration whatever --@cuvil//cuvil:quantization and
    --@cuvil//cuvil:precision are, so that changing either does not rebuild them.

    Args:
      name: target name (`<name>_defaults` is made beside it).
      deps: cc_library targets.
      **kwargs: visibility, tags, testonly.
    """
    _cc_flags_default(name = name + "_defaults", deps = deps, **kwargs)
    _cc_flags_away(name = name, deps = [":" + name + "_defaults"], **kwargs)

# -- the macro -------------------------------------------------------------------------

RUNTIME = str(Label("//:runtime"))
RUNTIME_MAIN = str(Label("//:runtime_main"))

def cuvil_model(
        name,
        model,
        config,
        quantization = None,
        plugins = [],
        data = [],
        calibration = [],
        precision = None,
        visibility = None,
        tags = [],
        testonly = False,
        **kwargs):
    """A model compiled by Cuvil, as a cc_library for C/C++ code.

    Capture runs once, in the exec configuration (it needs the framework); compile
    runs for the target platform (its Cuvil toolchain gives the LLVM triple, cpu and
    features) and quantization, and needs no framework; the C toolchain of the target
    compiles the glue and links.

    C/C++ code includes `"<package>/<name>.h"` and calls `<prefix>_create`,
    `<prefix>_run`, `<prefix>_destroy` (prefix: the config's `model.name`).

    Targets created:
      <name>            cc_library: the generated header `<name>.h`, the model's object
                        and weights object, the API glue, the Cuvil runtime, `plugins`.
                        List it in the deps of cc_binary / cc_library / cc_test.
      <name>_main       cc_library (alwayslink) of the same model with the executable's
                        `main` (npy/image inputs, JSON/npy outputs); a cc_binary with
                        only this in deps is the standalone executable (cuvil_binary
                        uses it).
      <name>_capture    cuvil_capture: `<name>_capture.cvir` (tagged manual; built in
                        the exec configuration through <name>_compile).
      <name>_compile    cuvil_compile: `<name>.o`, `<name>.weights.o`, `<name>.h`,
                        `<name>.json`, `<name>_api.c`, `<name>_app.c` in
                        `<name>.<quantization>-<precision>/` (one directory per
                        quantization, so switching keeps both cached), `<name>.h`
                        and `<name>.json` beside it; provides CuvilModelInfo.
      <name>_header, <name>_objects, <name>_manifest, <name>_api_glue, <name>_app_glue
                        filegroups over the output groups of <name>_compile (the
                        manifest is a runfile of <name> and <name>_main).
      <name>_c_deps, <name>_main_c_deps
                        cuvil_c_deps: the runtime (and `runtime_main`) and `plugins`
                        with the Cuvil flags at their defaults, so a quantization
                        or precision switch rebuilds the model, not them.

    Args:
      name: target name; also the header's name.
      model: label of the model's Python sources (py_library or filegroup).
      config: label of the Cuvil config (.yaml).
      quantization: none | fp16 | int8_sym | int4_block; overrides
        --@cuvil//cuvil:quantization (default: the flag). Accepts select().
      plugins: cc_library targets linked with the model (pre/post-processing plugins);
        their headers are inputs of the compile action.
      data: files the config or the model reads (labels, checkpoints).
      calibration: calibration inputs (.npy, .npz, images) for int8_sym: they replace
        the config's quantization.calibration.files (its ranges/percentile still
        apply), so `--@cuvil//cuvil:quantization=int8_sym` works on a config without them.
      precision: f32 | bf16 (conv2d/matmul in bfloat16 with f32 accumulation; with
        quantization none only); overrides --@cuvil//cuvil:precision (default: the flag,
        whose default is f32: the config's own `precision` is not read under Bazel).
        Accepts select().
      visibility, tags, testonly: as usual, applied to every target.
      **kwargs: passed to the <name> cc_library (e.g. `alwayslink`; `linkstatic =
        False` to also build lib<name>.so).
    """
    common = dict(tags = tags, testonly = testonly)
    cuvil_capture(
        name = name + "_capture",
        model = model,
        config = config,
        data = data,
        visibility = ["//visibility:private"],
        tags = tags + ([] if "manual" in tags else ["manual"]),
        testonly = testonly,
    )
    cuvil_compile(
        name = name + "_compile",
        capture = ":" + name + "_capture",
        model_name = name,
        quantization = quantization or "",
        precision = precision or "",
        plugins = plugins,
        data = data,
        calibration = calibration,
        visibility = visibility,
        **common
    )
    for group in ["header", "objects", "manifest", "api_glue", "app_glue"]:
        native.filegroup(
            name = "%s_%s" % (name, group),
            srcs = [":" + name + "_compile"],
            output_group = group,
            visibility = visibility,
            **common
        )
    cuvil_c_deps(
        name = name + "_c_deps",
        deps = [RUNTIME] + plugins,
        visibility = ["//visibility:private"],
        **common
    )
    cuvil_c_deps(
        name = name + "_main_c_deps",
        deps = [RUNTIME_MAIN, RUNTIME] + plugins,
        visibility = ["//visibility:private"],
        **common
    )
    library_kwargs = dict(common, linkstatic = True)  # no lib<name>.so (large) unless asked
    library_kwargs.update(kwargs)
    cc_library(
        name = name,
        srcs = [":" + name + "_objects", ":" + name + "_api_glue"],
        hdrs = [":" + name + "_header"],
        deps = [":" + name + "_c_deps"],
        # `<name>.json` (the manifest) with the library: bazel-bin/<package>/<name>.json
        # is there after building anything that links the model.
        data = [":" + name + "_manifest"],
        visibility = visibility,
        **library_kwargs
    )
    cc_library(
        name = name + "_main",
        srcs = [":" + name + "_objects", ":" + name + "_app_glue"],
        hdrs = [":" + name + "_header"],
        deps = [":" + name + "_main_c_deps"],
        data = [":" + name + "_manifest"],
        alwayslink = True,
        linkstatic = True,
        visibility = visibility,
        **common
    )

def model_main_label(model):
    """The `<name>_main` library of the cuvil_model `model` (a label string)."""
    return sibling_label(model, "_main")
