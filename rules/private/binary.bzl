"""cuvil_binary: a model's standalone executable, optionally for another platform
(an outgoing transition sets --platforms, so no command-line flags are needed)."""

load("@rules_cc//cc:defs.bzl", "cc_binary")
load(":model.bzl", "QUANTIZATIONS", "model_main_label")

_PLATFORMS = "//command_line_option:platforms"
_PLATFORM_SUFFIX = "//command_line_option:platform_suffix"
_QUANTIZATION = str(Label("//cuvil:quantization"))

# Three transitions, so that each sets only what its target asks for: a setting a
# transition writes is part of the output directory's name on Bazel 4.2.3 even when
# its value is unchanged, and a platform binary that also wrote the quantization would
# rebuild the C runtime for every --@cuvil//cuvil:quantization (which only the compile
# stage reads). The platform's name becomes the output directory's suffix
# (`k8-fastbuild-linux_aarch64-ST-...`), so cross builds are recognisable.
def _platform_settings(attr):
    return {
        _PLATFORMS: [str(attr.platform)],
        _PLATFORM_SUFFIX: "-" + attr.platform.name,
    }

def _platform_transition_impl(_settings, attr):
    return _platform_settings(attr)

def _quantization_transition_impl(_settings, attr):
    return {_QUANTIZATION: attr.quantization}

def _platform_quantization_transition_impl(_settings, attr):
    return dict(_platform_settings(attr), **{_QUANTIZATION: attr.quantization})

_platform_transition = transition(
    implementation = _platform_transition_impl,
    inputs = [],
    outputs = [_PLATFORMS, _PLATFORM_SUFFIX],
)

_quantization_transition = transition(
    implementation = _quantization_transition_impl,
    inputs = [],
    outputs = [_QUANTIZATION],
)

_platform_quantization_transition = transition(
    implementation = _platform_quantization_transition_impl,
    inputs = [],
    outputs = [_PLATFORMS, _PLATFORM_SUFFIX, _QUANTIZATION],
)

def _single(dep):
    # Bazel 4.2.3 hands an attribute with an outgoing transition over as a list.
    return dep[0] if type(dep) == "list" else dep

def _cuvil_platform_binary_impl(ctx):
    binary = _single(ctx.attr.binary)
    src = binary[DefaultInfo].files_to_run.executable
    out = ctx.actions.declare_file(ctx.label.name)
    ctx.actions.symlink(output = out, target_file = src, is_executable = True)
    runfiles = ctx.runfiles(files = [out]).merge(binary[DefaultInfo].default_runfiles)
    return [DefaultInfo(executable = out, files = depset([out]), runfiles = runfiles)]

def _platform_binary_rule(cfg, doc):
    attrs = {
        "binary": attr.label(
            mandatory = True,
            executable = True,
            cfg = cfg,
            doc = "The cc_binary (built in the transitioned configuration).",
        ),
        "platform": attr.label(doc = "Target platform (default: the current --platforms)."),
        "quantization": attr.string(
            values = [""] + QUANTIZATIONS,
            doc = "Sets --@cuvil//cuvil:quantization below this target (default: unchanged).",
        ),
    }
    if cfg != "target":
        attrs["_allowlist_function_transition"] = attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        )
    return rule(implementation = _cuvil_platform_binary_impl, doc = doc, attrs = attrs, executable = True)

_platform_binary = _platform_binary_rule(_platform_transition, "`binary` built for `platform`.")
_quantization_binary = _platform_binary_rule(_quantization_transition, "`binary` built with `quantization`.")
_platform_quantization_binary = _platform_binary_rule(
    _platform_quantization_transition,
    "`binary` built for `platform` with `quantization`.",
)

_current_binary = _platform_binary_rule("target", "`binary` in the current configuration.")

def _host_binary(name, binary, platform, quantization, **kwargs):
    _current_binary(name = name, binary = binary, **kwargs)

def cuvil_platform_binary(name, binary, platform = None, quantization = None, **kwargs):
    """The executable `binary` built for `platform` (its name is the suffix of the
    output directory) and/or with `quantization` (sets --@cuvil//cuvil:quantization
    below it); a symlink `<name>` to it in the current configuration.

    Args:
      name: target name; the symlink's file name.
      binary: label of an executable (e.g. a cc_binary).
      platform: label of a platform(), or None (the current --platforms).
      quantization: none | fp16 | int8_sym | int4_block, or None (unchanged).
      **kwargs: visibility, tags, testonly.
    """
    if platform and quantization:
        _platform_quantization_binary(name = name, binary = binary, platform = platform, quantization = quantization, **kwargs)
    elif platform:
        _platform_binary(name = name, binary = binary, platform = platform, **kwargs)
    elif quantization:
        _quantization_binary(name = name, binary = binary, quantization = quantization, **kwargs)
    else:
        fail("cuvil_platform_binary %s: give `platform` or `quantization`" % name)

def cuvil_binary(
        name,
        model,
        platform = None,
        quantization = None,
        visibility = None,
        tags = [],
        testonly = False,
        **kwargs):
    """A standalone executable of a cuvil_model (no Python, no framework).

    `<name> --input x.npy --output y.json|y.npy` (images too where the config has image
    pre-processing and the platform links the codecs: x86_64 Linux); `--help` lists
    the model's inputs and outputs.

    With `platform`, an outgoing transition builds the model and the executable for
    that platform, so `bazel build //pkg:<name>` needs no flags; the capture stage is
    shared with every other platform. With `quantization`, the same transition sets
    --@cuvil//cuvil:quantization (a cuvil_model's own `quantization` attribute still wins).

    Targets created:
      <name>          the executable (a symlink to <name>_native built for `platform`).
      <name>_native   cc_binary over the model's `<model>_main` library, in the
                      current configuration (tagged manual when `platform` or
                      `quantization` is set: build <name> instead).

    Args:
      name: target name; the executable's file name.
      model: label of a cuvil_model target.
      platform: label of a platform() (e.g. //platforms:linux_aarch64), or None.
      quantization: none | fp16 | int8_sym | int4_block, or None.
      visibility, tags, testonly: as usual.
      **kwargs: passed to the cc_binary (e.g. `linkopts`, `features`).
    """
    transitioned = platform != None or quantization != None
    cc_binary(
        name = name + "_native",
        deps = [model_main_label(model)],
        visibility = ["//visibility:private"],
        tags = tags + (["manual"] if transitioned and "manual" not in tags else []),
        testonly = testonly,
        **kwargs
    )
    (_host_binary if not transitioned else cuvil_platform_binary)(
        name = name,
        binary = ":" + name + "_native",
        platform = platform,
        quantization = quantization,
        visibility = visibility,
        tags = tags,
        testonly = testonly,
    )
