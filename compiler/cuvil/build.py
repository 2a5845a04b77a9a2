"""The three stages behind `cuvil build`, each also a subcommand, with a content-hashed
local cache (cache.py): capture (framework, capture_stage.py) -> .cvir; compile (numpy +
llvmlite) -> object, weights object, header, manifest; link (C toolchain) -> executable,
.so or .a.

Targets: `host` (this x86_64 machine and its CPU features), `x86_64-linux-gnu` (baseline
or a named `target.cpu` / `target.features`), `aarch64-linux-gnu` (NEON) and
`wasm32-wasi` (SIMD128, single-threaded). The compile stage stamps the model object
with an ABI signature (cuvil.runtime.abi); the link stage uses the target's C
toolchain (cuvil.native.toolchain_for) and checks the signatures of everything it links.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Callable

from .backend.llvm.target import Target
from .cache import CACHE_FORMAT, Cache, cache_key, compiler_hash, sha256_file, tree_hash
from .capture_stage import cached_capture
from .config import Config
from .errors import CuvilError, short
from .fsutil import atomic_copy, atomic_write, read_regular
from .native import check_image_support, link_artifact, runtime_hash, toolchain_for
from .options import CALIBRATED, CalibrationFiles, CompileOptions, TargetSpec
from .quant_config import calibration_inputs, quantization_from_config
from .runtime import abi

MAX_LABELS = 16 << 20    # a labels file (one class name a line) of at most 16 MiB
MAX_MANIFEST = 64 << 20  # a compile stage's manifest of at most 64 MiB


# -- compile ------------------------------------------------------------------------------------
def compile_options(cfg: Config) -> CompileOptions:
    """Everything from the config that the compile stage's output depends on."""
    d = cfg.data
    pre = {s["name"]: dict(s["preprocess"]) for s in d.get("inputs", []) if s.get("preprocess")}
    post = {}
    for i, o in enumerate(d.get("outputs", [])):
        p = dict(o.get("postprocess") or {})
        if p.get("labels"):
            raw = read_regular(cfg.resolve(p["labels"]), MAX_LABELS, "labels file")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise cfg.error(["outputs", i, "postprocess", "labels"], "the labels file is not UTF-8 text") from None
            p["labels"] = [line.strip() for line in text.splitlines() if line.strip()]
        if p and p.get("kind") != "none":
            post[o["name"]] = p
    target = dict(d.get("target") or {})
    plugin = d.get("plugin") or {}
    for cfg_pre in pre.values():
        if cfg_pre.get("kind") == "plugin":
            cfg_pre["options"] = _option_strings(cfg_pre.get("options"))
    post_plugin = None
    if plugin.get("postprocess"):
        post_plugin = {"plugin": plugin["postprocess"]["plugin"],
                       "options": _option_strings(plugin["postprocess"].get("options"))}
    # Calibration photos go through the input's image preprocess; where an override
    # drops it for this target (no image codecs there), the base config's applies.
    cal_pre = dict(pre)
    for s in (cfg.base_data or d).get("inputs", []):
        p = s.get("preprocess") or {}
        if p.get("kind") == "image" and s["name"] not in pre:
            cal_pre[s["name"]] = dict(p)
    optimize = d.get("optimize") or {}
    return CompileOptions(
        name=cfg.name,
        output_names=tuple(o["name"] for o in d.get("outputs", [])),
        preprocess=pre,
        calibration_preprocess=cal_pre if cal_pre != pre else None,
        postprocess=post,
        postprocess_plugin=post_plugin,
        custom_ops=tuple(sorted({c["symbol"] for c in plugin.get("custom_ops", [])})),
        target=TargetSpec(cfg.target, target.get("cpu", ""), target.get("features", "")),
        quantization=quantization_from_config(cfg),
        threads=optimize.get("threads", 1),
        fuse=optimize.get("fuse", True),
        specialize=tuple(d.get("specialize") or ()),
    )


def _option_strings(options: dict | None) -> dict:
    """Plugin options as the strings the C side gets (true/false, numbers as written)."""
    out = {}
    for k, v in sorted((options or {}).items()):
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


def optimised_module(cvir: Path, opts: CompileOptions, target: Target | None = None, report: bool = False):
    """The compile stage up to code generation: the bundle read and named per opts, its
    calibration files loaded, then the pass pipeline (passes.pipeline.optimise) for
    `target` (a backend.llvm.target.Target, or None where none is known). Returns
    (module, fp32 weight bytes). `report` has int8_sym record every candidate layer
    (`cuvil quant-report`)."""
    from .ir import read_bundle
    from .passes.pipeline import optimise
    from .passes.quantize_weights import weight_bytes

    q = opts.quantization
    module = read_bundle(cvir)
    weights_before = weight_bytes(module)
    fn = module.main
    if opts.output_names:
        if len(opts.output_names) != len(fn.output_names):
            raise CuvilError(f"the model has {len(fn.output_names)} outputs, the config names {len(opts.output_names)}")
        fn.output_names = list(opts.output_names)
    for name in list(opts.preprocess) + list(opts.postprocess):
        if name not in fn.input_names + fn.output_names:
            raise CuvilError(f"pre/post-processing names {name!r}, which is not an input or output of the model")
    if q.needs_calibration and not q.has_calibration:
        raise CuvilError(f"quantization method {q.method!r} needs calibration inputs: add "
                         "quantization.calibration (files or a generator) to the config")
    calibration = q.calibration
    if isinstance(calibration, CalibrationFiles):  # a config's: loaded where the method reads them
        pre = opts.preprocess if opts.calibration_preprocess is None else opts.calibration_preprocess
        calibration = tuple(calibration_inputs(calibration, fn, pre)) if q.method in CALIBRATED else ()
    optimise(module, opts.replace(quantization=replace(q, calibration=calibration)), target, report=report)
    return module, weights_before


def compile_bundle(cvir: Path, opts: CompileOptions, out_dir: Path) -> dict:
    """The compile stage: .cvir + options -> <name>.o, <name>.weights.o, <name>.h,
    <name>.json in out_dir. Imports no framework. Returns the manifest."""
    from .backend.header import render_header
    from .backend.llvm.codegen import generate
    from .backend.llvm.target import compile_to_object
    from .backend.llvm.weights import weights_object
    from .passes.quantize_weights import weight_bytes

    target = opts.target.resolve()
    module, weights_before = optimised_module(cvir, opts, target)
    name = opts.name
    gen = generate(module, name, specialize=opts.specialize)
    used = sorted({op.attrs["symbol"] for op in module.main.body.ops if op.name == "cuvil.custom"})
    if used and not opts.custom_ops:
        raise CuvilError(f"the model calls the custom op(s) {', '.join(used)}: list the plugin module(s) that "
                         "define them in plugin.modules and map the ops in plugin.custom_ops")
    manifest = make_manifest(gen, target, opts.threads, opts.preprocess, opts.postprocess)
    manifest["quantization"] = {"method": opts.quantization.method, "weight_bytes_fp32": weights_before,
                                "weight_bytes": weight_bytes(module),
                                **_int8_report(module.main.attrs.get("quantization"))}
    manifest["precision"] = {"compute": opts.quantization.precision,
                             **(module.main.attrs.get("precision") or {})}
    if manifest["precision"]["compute"] == "bf16":
        # "dpbf16ps": AVX-512-BF16 instructions; "bf16": the same arithmetic in the f32 kernels
        manifest["precision"]["kernel"] = target.bf16_dot.dot
    manifest["plugins"] = {"postprocess": opts.postprocess_plugin, "custom_ops": used}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / f"{name}.o", compile_to_object(gen.llvm_ir + signature_ir(name, target.triple), target))
    atomic_write(out_dir / f"{name}.weights.o", weights_object(f"{name}_weights", gen.weights, target))
    atomic_write(out_dir / f"{name}.h", render_header(manifest))
    atomic_write(out_dir / f"{name}.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def _int8_report(found: dict | None) -> dict:
    """The manifest's int8 figures: from calibration (kept_f32: the most sensitive ops left
    f32) or from a pre-quantized graph (qat: its weights without an int8 kernel)."""
    if not found:
        return {}
    if found.get("source") == "graph":
        return {"qat_mode": True, "int8_ops": found["int8_ops"], "kept_f32": [],
                "f32_weights": [str(w) for w in found["f32_weights"]]}
    return {"int8_ops": found["int8_ops"], "kept_f32": found["kept_f32"]}


def make_manifest(gen, target, threads: int = 1, preprocess=None, postprocess=None) -> dict:
    """The manifest of generated code: what the header, the link stage and the runtime
    read (the compile stage adds its quantization and plugin sections)."""
    return {
        "format": "cuvil-manifest-1",
        "prefix": gen.prefix,
        "target": {"triple": target.triple, "cpu": target.cpu, "features": target.features},
        "signature": {"triple": target.triple, "abi_version": abi.ABI_VERSION,
                      "runtime_version": abi.RUNTIME_VERSION, "plugin_abi_version": abi.PLUGIN_ABI_VERSION},
        "arena_size": gen.arena_size,
        "threads": threads,
        "dims": [{"name": n, "min": lo, "max": hi} for n, lo, hi in gen.symbols],
        "inputs": [{"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in gen.inputs],
        "outputs": [{"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in gen.outputs],
        "preprocess": preprocess or {},
        "postprocess": postprocess or {},
    }


def signature_ir(prefix: str, triple: str) -> str:
    """LLVM IR defining `<prefix>_signature`, the model object's ABI signature string
    (read by the link stage from the object's bytes and by the runtime at run time)."""
    text = abi.model_signature(prefix, triple).encode("ascii") + b"\0"
    body = "".join(chr(c) if 0x20 <= c < 0x7F and c not in b'"\\' else f"\\{c:02X}" for c in text)
    return f'\n@{prefix}_signature = hidden constant [{len(text)} x i8] c"{body}", align 1\n'


def cached_compile(cvir: Path, opts: CompileOptions, cache: Cache) -> Path:
    key = cache_key("compile", CACHE_FORMAT, sha256_file(cvir), opts.to_json(), compiler_hash())
    entry, _ = cache.get_or_make("compile", key, lambda tmp: compile_bundle(cvir, opts, tmp))
    return entry


# -- link -----------------------------------------------------------------------------------------
KIND_FILES = {"executable": "{name}", "shared": "lib{name}.so", "static": "lib{name}.a"}
_NATIVE_KIND = {"executable": "exe", "shared": "shared", "static": "static"}


def _manifest_of(compiled: Path) -> dict:
    manifests = sorted(compiled.glob("*.json"))
    if len(manifests) != 1:
        raise CuvilError(f"{compiled}: expected one manifest (*.json) from the compile stage, found {len(manifests)}")
    try:
        return json.loads(read_regular(manifests[0], MAX_MANIFEST, "manifest"))
    except (ValueError, RecursionError) as e:
        raise CuvilError(f"{manifests[0]}: not a JSON manifest: {short(str(e), 100)}") from None


def artifact_name(manifest: dict, kind: str) -> str:
    name = KIND_FILES[kind].format(name=manifest["prefix"])
    if kind == "executable" and Target(manifest["target"]["triple"]).is_wasm:
        name += ".wasm"
    return name


def link_compiled(compiled: Path, kind: str, out: Path, cc: str | None = None,
                  plugins: tuple[Path, ...] = ()) -> Path:
    """The link stage: the compile stage's outputs in `compiled` (+ plugin modules) ->
    one artifact at `out`, with the C toolchain of the manifest's target (`cc`
    overrides it)."""
    manifest = _manifest_of(compiled)
    name = manifest["prefix"]
    objects = [compiled / f"{name}.o", compiled / f"{name}.weights.o"]
    for p in objects + [compiled / f"{name}.h"]:
        if not p.is_file():
            raise CuvilError(f"{p}: missing compile-stage output")
    return link_artifact(_NATIVE_KIND[kind], objects, manifest, compiled / f"{name}.h", out, cc=cc,
                         plugins=plugins)


def _cc_version(cc: list[str]) -> str:
    try:
        return subprocess.run([*cc, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        raise CuvilError(f"the C compiler {cc[0]!r} was not found (install it, or set CC)") from None


def cached_link(compiled: Path, kind: str, cache: Cache, cc: str | None = None,
                plugins: tuple[Path, ...] = ()) -> Path:
    files = {p.name: sha256_file(p) for p in sorted(compiled.iterdir()) if p.is_file()}
    manifest = _manifest_of(compiled)
    tool = toolchain_for(manifest["target"]["triple"], cc)
    plugin_files = [[Path(p).name, sha256_file(Path(p))] for p in plugins]
    # Headers next to a C plugin may be included by it.
    plugin_dirs = sorted({str(Path(p).resolve().parent) for p in plugins if str(p).endswith(".c")})
    plugin_headers = [tree_hash(Path(d), ("*.h",)) for d in plugin_dirs]
    key = cache_key("link", CACHE_FORMAT, files, kind, runtime_hash(), compiler_hash(), _cc_version(tool.cc),
                tool.cc, plugin_files, plugin_headers)
    name = manifest["prefix"]
    fname = artifact_name(manifest, kind)

    def make(tmp: Path):
        link_compiled(compiled, kind, tmp / fname, cc, plugins)
        if kind != "executable":
            shutil.copyfile(compiled / f"{name}.h", tmp / f"{name}.h")
    entry, _ = cache.get_or_make("link", key, make)
    return entry / fname


def plugin_modules(cfg: Config) -> tuple[Path, ...]:
    return tuple(cfg.resolve(m).resolve() for m in (cfg.data.get("plugin") or {}).get("modules", []))


def build(cfg: Config, output: Path, *, kind: str | None = None, cache_dir: Path | None = None,
          cc: str | None = None, log: Callable[[str], None] = print) -> Path:
    """capture -> compile -> link with the cache; copy the artifact to `output` atomically.
    The target is the config's (cfg.target: --target, else target.arch, with the
    matching overrides applied by load_config)."""
    kind = kind or (cfg.data.get("build") or {}).get("artifact", "executable")
    cache = Cache(cache_dir or cfg.base / ".cuvil-cache", log)
    opts = compile_options(cfg)
    target = opts.target.resolve()  # fail before any work on an impossible target
    tool = toolchain_for(target, cc)
    tool.check_kind(_NATIVE_KIND[kind])
    tool.check_installed()
    if kind == "executable":
        images = [i for i, s in enumerate(cfg.data.get("inputs", []))
                  if (s.get("preprocess") or {}).get("kind") == "image"]
        if images:
            try:
                check_image_support(tool)
            except CuvilError as e:
                raise cfg.error(["inputs", images[0], "preprocess"], str(e)) from None
    cvir = cached_capture(cfg, cache)
    compiled = cached_compile(cvir, opts, cache)
    manifest = _manifest_of(compiled)
    q = manifest.get("quantization") or {}
    prec = manifest.get("precision") or {}
    if prec.get("compute") == "bf16":
        log(f"[compile] precision bf16: {prec.get('bf16_ops', 0)} conv2d/matmul ops in bfloat16; weights "
            f"{q['weight_bytes_fp32']} bytes (fp32) -> {q['weight_bytes']} bytes")
        if prec.get("kernel") != "dpbf16ps":
            log("[compile] precision bf16: the target has no AVX-512-BF16: the bf16 products run in the f32 "
                "kernels (the same results, about f32's speed); matmul weights stay bf16, conv weights are "
                "stored as f32")
    if q.get("method", "none") != "none":
        log(f"[compile] weights {q['weight_bytes_fp32']} bytes (fp32) -> {q['weight_bytes']} bytes ({q['method']})")
        if "int8_ops" in q:
            kept = ", ".join(f"#{k['index']} {k['op']} {k['weight']} ({k['loc']}, error {k['error']})"
                             for k in q["kept_f32"]) or "none"
            log(f"[compile] int8 ops: {q['int8_ops']}; kept in f32: {kept}")
        if q.get("qat_mode"):
            log(f"[compile] scales from the model's quantize/dequantize nodes; weights without an int8 kernel "
                f"(f32): {', '.join(q['f32_weights']) or 'none'}")
    artifact = cached_link(compiled, kind, cache, cc, plugin_modules(cfg))
    output = Path(output)
    atomic_copy(artifact, output)
    if kind != "executable":
        atomic_copy(artifact.parent / f"{opts.name}.h", output.parent / f"{opts.name}.h")
    log(f"[build] {output}")
    return output
