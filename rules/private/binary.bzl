"""cuvil_binary: a model's standalone executable, optionally for another platform
(an outgoing transition sets --platforms, so no command-line flags are needed)."""

load("@rules_cc//cc:defs.bzl", "cc_binary")
load(":model.bzl", "QUANTIZATIONS", "model_main_label")

_PLATFORMS = "//command_line_option:platforms"
_QUANTIZATION = str(Label("//cuvil:quantization"))

def _target_transition_impl(settings, attr):
    out = {
        _PLATFORMS: settings[_PLATFORMS],
        _QUANTIZATION: settings[_QUANTIZATION],
    }
    if attr.platform:
        out[_PLATFORMS] = [str(attr.platform)]
    if attr.quantization:
        out[_QUANTIZATION] = attr.quantization
    return out

cuvil_target_transition = transition(
    implementation = _target_transition_impl,
    inputs = [_PLATFORMS, _QUANTIZATION],
    outputs = [_PLATFORMS, _QUANTIZATION],
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

cuvil_platform_binary = rule(
    implementation = _cuvil_platform_binary_impl,
    doc = "The executable `binary` built for `platform` with `quantization`.",
    attrs = {
        "binary": attr.label(
            mandatory = True,
            executable = True,
            cfg = cuvil_target_transition,
            doc = "The cc_binary (built in the transitioned configuration).",
        ),
        "platform": attr.label(doc = "Target platform (default: the current --platforms)."),
        "quantization": attr.string(
            values = [""] + QUANTIZATIONS,
            doc = "Sets --//cuvil:quantization below this target (default: unchanged).",
        ),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
    executable = True,
)

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
    --//cuvil:quantization (a cuvil_model's own `quantization` attribute still wins).

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
    cuvil_platform_binary(
        name = name,
        binary = ":" + name + "_native",
        platform = platform,
        quantization = quantization or "",
        visibility = visibility,
        tags = tags,
        testonly = testonly,
    )
