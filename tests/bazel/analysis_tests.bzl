"""Analysis tests of the Cuvil rules (skylib analysistest): the actions they register,
their mnemonics and command lines, per target platform and quantization."""

load("@bazel_skylib//lib:unittest.bzl", "analysistest", "asserts")
load("//rules:defs.bzl", "CuvilModelInfo")

_PLATFORMS = "//command_line_option:platforms"
_QUANTIZATION = "//cuvil:quantization"
_PRECISION = "//cuvil:precision"

def _actions_with(env, mnemonic):
    return [a for a in analysistest.target_actions(env) if a.mnemonic == mnemonic]

def _flag(argv, name):
    """The value after `name` in argv (None if absent)."""
    for i in range(len(argv) - 1):
        if argv[i] == name:
            return argv[i + 1]
    return None

def _only_compile_action(env):
    """The one CuvilCompile action (beside it: the symlinks `<name>.h` and `<name>.json`)."""
    actions = analysistest.target_actions(env)
    asserts.equals(
        env,
        ["CuvilCompile", "Symlink", "Symlink"],
        sorted([a.mnemonic for a in actions]),
        "actions of a cuvil_compile target",
    )
    compiles = [a for a in actions if a.mnemonic == "CuvilCompile"]
    return compiles[0] if compiles else None

def _check_compile(env, target, llvm_triple, cpu, features, quantization, model = "mlp", precision = "f32"):
    action = _only_compile_action(env)
    if action == None:
        return
    argv = action.argv
    asserts.equals(env, target, _flag(argv, "--target"), "--target in " + str(argv))
    asserts.equals(env, llvm_triple, _flag(argv, "--llvm-triple"), "--llvm-triple")
    asserts.equals(env, cpu, _flag(argv, "--cpu"), "--cpu")
    asserts.equals(env, features, _flag(argv, "--features"), "--features")
    asserts.equals(env, quantization, _flag(argv, "--quantization"), "--quantization")
    asserts.equals(env, precision, _flag(argv, "--precision"), "--precision")
    asserts.true(env, llvm_triple in action.mnemonic + " " + str(argv), "triple on the command line")

    # One directory per quantization and precision: switching keeps both results.
    variant = "%s.%s-%s/%s" % (model, quantization, precision, model)
    for f in action.outputs.to_list():
        asserts.true(env, f.short_path.endswith("/" + variant + f.basename[len(model):]), "output " + f.short_path)

    # Every input declared: the bundle, the config, the lock file, the compiler.
    inputs = [f.short_path for f in action.inputs.to_list()]
    for needed in ["requirements.lock", "tests/bazel/mlp.yaml", "compiler/cuvil/cli.py",
                   "compiler/cuvil/backend/llvm/target.py", "rules/private/compile_model.py"]:
        asserts.true(env, needed in inputs, "%s is an input of CuvilCompile" % needed)
    bundles = [f for f in action.inputs.to_list() if f.basename == model + "_capture.cvir"]
    asserts.equals(env, 1, len(bundles), "one .cvir input")

    # The bundle comes from one configuration whatever the target platform (the
    # capture runs once): exec/host, never a transitioned target configuration.
    if bundles:
        path = bundles[0].path
        asserts.true(env, path.startswith("bazel-out/host/") or "-exec" in path, "capture config: " + path)
        asserts.false(env, "ST-" in path.split("/")[1] and "-exec" not in path, "capture config: " + path)

    # Hermetic: the compiler runs from its declared sources with a fixed environment.
    asserts.equals(env, "compiler", action.env.get("PYTHONPATH", "").split(":")[0], "PYTHONPATH")
    asserts.false(env, "PATH" in action.env, "no PATH from the client")

    info = analysistest.target_under_test(env)[CuvilModelInfo]
    asserts.equals(env, llvm_triple, info.llvm_triple, "CuvilModelInfo.llvm_triple")
    asserts.equals(env, quantization, info.quantization, "CuvilModelInfo.quantization")

def _compile_host_test_impl(ctx):
    env = analysistest.begin(ctx)
    _check_compile(env, "x86_64-linux-gnu", "x86_64-unknown-linux-gnu", "x86-64-v3",
                   "+avx2,+fma,+avx,+f16c,+bmi,+bmi2,+popcnt,+sse4.2", "none")
    return analysistest.end(env)

compile_host_test = analysistest.make(
    _compile_host_test_impl,
    config_settings = {_PLATFORMS: "//platforms:linux_x86_64"},
)

def _compile_aarch64_test_impl(ctx):
    env = analysistest.begin(ctx)
    _check_compile(env, "aarch64-linux-gnu", "aarch64-unknown-linux-gnu", "generic", "+neon", "none")
    return analysistest.end(env)

compile_aarch64_test = analysistest.make(
    _compile_aarch64_test_impl,
    config_settings = {_PLATFORMS: "//platforms:linux_aarch64"},
)

def _compile_wasm32_test_impl(ctx):
    env = analysistest.begin(ctx)
    _check_compile(env, "wasm32-wasi", "wasm32-unknown-wasi", "generic", "+simd128", "none")
    return analysistest.end(env)

compile_wasm32_test = analysistest.make(
    _compile_wasm32_test_impl,
    config_settings = {_PLATFORMS: "//platforms:wasm32_wasi"},
)

# --//cuvil:quantization reaches the compile command line ...
def _quantization_flag_test_impl(ctx):
    env = analysistest.begin(ctx)
    _check_compile(env, "aarch64-linux-gnu", "aarch64-unknown-linux-gnu", "generic", "+neon", "int8_sym")
    return analysistest.end(env)

quantization_flag_test = analysistest.make(
    _quantization_flag_test_impl,
    config_settings = {
        _PLATFORMS: "//platforms:linux_aarch64",
        _QUANTIZATION: "int8_sym",
    },
)

# ... and a cuvil_model's own `quantization` attribute wins over it.
def _quantization_attribute_test_impl(ctx):
    env = analysistest.begin(ctx)
    _check_compile(env, "x86_64-linux-gnu", "x86_64-unknown-linux-gnu", "x86-64-v3",
                   "+avx2,+fma,+avx,+f16c,+bmi,+bmi2,+popcnt,+sse4.2", "fp16", model = "mlp_fp16")
    return analysistest.end(env)

quantization_attribute_test = analysistest.make(
    _quantization_attribute_test_impl,
    config_settings = {
        _PLATFORMS: "//platforms:linux_x86_64",
        _QUANTIZATION: "int8_sym",
    },
)

# --//cuvil:precision=bf16 on the AVX-512-BF16 platform: its toolchain's features
# (vdpbf16ps) and the precision reach the compile command line ...
_AVX512_FEATURES = ("+avx2,+fma,+avx,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,+avx512f,+avx512bw,+avx512dq," +
                    "+avx512vl,+avx512cd,+avx512vnni,+avx512bf16,-prefer-256-bit")

def _precision_flag_test_impl(ctx):
    env = analysistest.begin(ctx)
    _check_compile(env, "x86_64-linux-gnu", "x86_64-unknown-linux-gnu", "x86-64-v4", _AVX512_FEATURES, "none",
                   precision = "bf16")
    return analysistest.end(env)

precision_flag_test = analysistest.make(
    _precision_flag_test_impl,
    config_settings = {
        _PLATFORMS: "//platforms:linux_x86_64_avx512",
        _PRECISION: "bf16",
    },
)

# ... and a cuvil_model's own `precision` attribute wins over the flag.
def _precision_attribute_test_impl(ctx):
    env = analysistest.begin(ctx)
    _check_compile(env, "x86_64-linux-gnu", "x86_64-unknown-linux-gnu", "x86-64-v3",
                   "+avx2,+fma,+avx,+f16c,+bmi,+bmi2,+popcnt,+sse4.2", "none", model = "mlp_bf16",
                   precision = "bf16")
    return analysistest.end(env)

precision_attribute_test = analysistest.make(
    _precision_attribute_test_impl,
    config_settings = {
        _PLATFORMS: "//platforms:linux_x86_64",
        _PRECISION: "f32",
    },
)

def _capture_test_impl(ctx):
    env = analysistest.begin(ctx)
    actions = analysistest.target_actions(env)
    asserts.equals(env, ["CuvilCapture"], [a.mnemonic for a in actions], "actions of a cuvil_capture target")
    if actions:
        argv = actions[0].argv
        asserts.equals(env, ["-m", "cuvil.cli", "capture"], argv[1:4], "runs the compiler's CLI: " + str(argv))
        asserts.equals(env, "tests/bazel/mlp.yaml", _flag(argv, "--config"), "--config")
        asserts.true(env, _flag(argv, "--output").endswith("tests/bazel/mlp_capture.cvir"), "--output")
        inputs = [f.short_path for f in actions[0].inputs.to_list()]
        for needed in ["examples/models/mlp.py", "examples/models/__init__.py", "examples/__init__.py",
                       "tests/bazel/mlp.yaml", "requirements.lock", "compiler/cuvil/frontends/torch.py"]:
            asserts.true(env, needed in inputs, "%s is an input of CuvilCapture" % needed)
        asserts.equals(env, "1", actions[0].env.get("PYTHONDONTWRITEBYTECODE"), "no __pycache__ writes")
    return analysistest.end(env)

capture_test = analysistest.make(_capture_test_impl)

# An unknown quantization method is rejected at analysis, naming the allowed values.
def _bad_quantization_test_impl(ctx):
    env = analysistest.begin(ctx)
    asserts.expect_failure(env, "quantization 'int3' is not a Cuvil quantization method (methods: none, fp16, int4_block, int8_sym)")
    return analysistest.end(env)

bad_quantization_test = analysistest.make(_bad_quantization_test_impl, expect_failure = True)

# The quantization flag is visible to select().
SelectedInfo = provider(fields = ["value"])

def _selected_value_impl(ctx):
    return [SelectedInfo(value = ctx.attr.value)]

selected_value = rule(
    implementation = _selected_value_impl,
    attrs = {"value": attr.string()},
)

def _select_test_impl(ctx):
    env = analysistest.begin(ctx)
    asserts.equals(env, "int4_block", analysistest.target_under_test(env)[SelectedInfo].value)
    return analysistest.end(env)

select_test = analysistest.make(
    _select_test_impl,
    config_settings = {_QUANTIZATION: "int4_block"},
)

# Plugins: their headers are inputs of the compile action.
def _plugin_test_impl(ctx):
    env = analysistest.begin(ctx)
    action = _only_compile_action(env)
    if action != None:
        inputs = [f.short_path for f in action.inputs.to_list()]
        asserts.true(env, "tests/bazel/plugin_stub.h" in inputs, "the plugin header is an input")
    return analysistest.end(env)

plugin_test = analysistest.make(_plugin_test_impl)

def _plugin_linked_test_impl(ctx):
    env = analysistest.begin(ctx)
    cc = analysistest.target_under_test(env)[CcInfo]
    headers = [f.short_path for f in cc.compilation_context.headers.to_list()]
    asserts.true(env, "tests/bazel/plugin_stub.h" in headers, "the model library carries the plugin")
    asserts.true(env, "tests/bazel/mlp_with_plugin.h" in headers, "and the model's header")
    return analysistest.end(env)

plugin_linked_test = analysistest.make(_plugin_linked_test_impl)

# cuvil_binary: the executable's target is a symlink to the transitioned cc_binary.
def _binary_test_impl(ctx):
    env = analysistest.begin(ctx)
    # (ExecutableSymlink in Bazel 4.2.3, Symlink in current Bazel.)
    actions = [a for a in analysistest.target_actions(env) if a.mnemonic in ("ExecutableSymlink", "Symlink")]
    asserts.equals(env, 1, len(actions), "one symlink action")
    exe = analysistest.target_under_test(env)[DefaultInfo].files_to_run.executable
    asserts.equals(env, "mlp_aarch64", exe.basename, "executable name")
    if actions:
        src = [f for f in actions[0].inputs.to_list() if f.basename == "mlp_aarch64_native"]
        asserts.equals(env, 1, len(src), "links to mlp_aarch64_native")
        if src:
            # Built in the configuration the platform transition made, not this one.
            asserts.true(env, src[0].root.path != exe.root.path, "%s vs %s" % (src[0].root.path, exe.root.path))
    return analysistest.end(env)

binary_test = analysistest.make(_binary_test_impl)

def cuvil_analysis_test_suite(name):
    """The tests above on //tests/bazel:mlp*; `name` is the test_suite."""
    tests = {
        "compile_host_test": (compile_host_test, ":mlp_compile"),
        "compile_aarch64_test": (compile_aarch64_test, ":mlp_compile"),
        "compile_wasm32_test": (compile_wasm32_test, ":mlp_compile"),
        "quantization_flag_test": (quantization_flag_test, ":mlp_compile"),
        "quantization_attribute_test": (quantization_attribute_test, ":mlp_fp16_compile"),
        "precision_flag_test": (precision_flag_test, ":mlp_compile"),
        "precision_attribute_test": (precision_attribute_test, ":mlp_bf16_compile"),
        "capture_test": (capture_test, ":mlp_capture"),
        "bad_quantization_test": (bad_quantization_test, ":mlp_bad_quantization_compile"),
        "select_test": (select_test, ":quantization_selected"),
        "binary_test": (binary_test, ":mlp_aarch64"),
        "plugin_test": (plugin_test, ":mlp_with_plugin_compile"),
        "plugin_linked_test": (plugin_linked_test, ":mlp_with_plugin"),
    }
    for test_name, (rule_fn, target) in tests.items():
        rule_fn(name = test_name, target_under_test = target, size = "small")
    native.test_suite(name = name, tests = [":" + t for t in tests])
