"""The `cuvil` command line.

    cuvil init --template NAME config.yaml          write a commented config template
    cuvil build --config config.yaml --output OUT [--target T]   capture + compile + link, cached
    cuvil capture --config config.yaml --output model.cvir
    cuvil compile model.cvir --config config.yaml --output-dir DIR [--target T] [--calibration F ...]
    cuvil link DIR --kind executable --output OUT [--plugin FILE ...]
    cuvil inspect model.cvir [--target T] [--graph out.svg] | DIR | manifest.json | ARTIFACT
                                                     IR, kernels, memory plan (a picture); or signatures
    cuvil quant-report --config config.yaml [--quantization M] [--inputs N] [--json FILE]
    cuvil run ARTIFACT [ARGS...]                     run an executable (qemu for aarch64, node for wasm)
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

from .backend.llvm.target import TARGET_NAMES
from .errors import CuvilError
from .options import PRECISIONS, QUANTIZATION_METHODS

TEMPLATES = ("pytorch-resnet50", "pytorch-mobilenetv2", "pytorch-bert", "pytorch-mlp")
IMAGE_TEMPLATES = ("pytorch-resnet50", "pytorch-mobilenetv2")  # init also writes examples/cat.jpg
SAMPLE_PHOTO = "examples/cat.jpg"
_PKG = Path(__file__).resolve().parent


def _examples_root(config_path: Path) -> str:
    """Where examples/ lives, relative to the config's directory (for the templates)."""
    repo = _PKG.parent.parent
    if not (repo / "examples" / "models").is_dir():
        return "."
    return os.path.relpath(repo, config_path.resolve().parent)


def _cmd_init(args) -> int:
    if args.template not in TEMPLATES:
        raise CuvilError(f"unknown template {args.template!r}; templates: {', '.join(TEMPLATES)}")
    out = Path(args.file)
    if out.exists() and not args.force:
        raise CuvilError(f"{out} exists (use --force to overwrite)")
    from .fsutil import atomic_write
    text = (_PKG / "templates" / f"{args.template}.yaml").read_text()
    atomic_write(out, text.replace("{root}", _examples_root(out)))
    print(f"wrote {out} (template {args.template})")
    photo = out.parent / SAMPLE_PHOTO
    if args.template in IMAGE_TEMPLATES and not photo.exists():
        atomic_write(photo, (_PKG / "templates" / "cat.jpg").read_bytes())
        print(f"wrote {photo} (a sample photo to try the executable on)")
    return 0


def _cmd_build(args) -> int:
    from .build import build
    from .config import load_config
    cfg = load_config(args.config, target=args.target)
    build(cfg, Path(args.output), kind=args.kind, cache_dir=args.cache_dir and Path(args.cache_dir))
    return 0


def _cmd_capture(args) -> int:
    from .capture_stage import capture_to
    from .config import load_config
    cfg = load_config(args.config)
    capture_to(cfg, Path(args.output))
    print(f"wrote {args.output}")
    return 0


def _cmd_compile(args) -> int:
    from dataclasses import replace

    from .build import compile_bundle, compile_options
    from .config import load_config
    def given(**options) -> dict:
        return {k: v for k, v in options.items() if v is not None}
    # The bundle holds the model: its source files need not be at hand (Bazel's compile
    # action has the config, not the model's sources).
    cfg = load_config(args.config, target=args.target, model_files=False)
    opts = compile_options(cfg)
    target = replace(opts.target, **given(cpu=args.cpu, features=args.features))
    q = replace(opts.quantization, **given(method=args.quantization, precision=args.precision))
    if args.calibration:
        from .quant_config import with_calibration_files
        q = with_calibration_files(q, args.calibration)
    opts = opts.replace(target=target, quantization=q)
    manifest = compile_bundle(Path(args.bundle), opts, Path(args.output_dir))
    print(f"wrote {manifest['prefix']}.o, .weights.o, .h, .json to {args.output_dir}")
    return 0


def _cmd_quant_report(args) -> int:
    from .config import load_config
    from .quant_report import format_report, quant_report, write_json
    if args.inputs is not None and args.inputs < 1:
        raise CuvilError(f"--inputs {args.inputs}: give at least 1")
    cfg = load_config(args.config)
    report = quant_report(cfg, args.quantization, args.inputs, args.cache_dir and Path(args.cache_dir),
                          log=lambda m: print(m, file=sys.stderr))
    sys.stdout.write(format_report(report))
    if args.json:
        write_json(report, Path(args.json))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _cmd_link(args) -> int:
    from .build import link_compiled
    link_compiled(Path(args.compiled), args.kind, Path(args.output), plugins=tuple(Path(p) for p in args.plugin))
    print(f"wrote {args.output}")
    return 0


MAX_MANIFEST = 64 << 20  # `inspect` reads a manifest of at most 64 MiB
MAX_BINARY = 16 << 30    # and an object or artifact of at most 16 GiB


def _print_signatures(path: Path) -> int:
    """ABI signatures of a compile-stage directory, a manifest, or any object/artifact."""
    import json

    from .fsutil import read_regular
    from .runtime import abi
    files = [path]
    if path.is_dir():
        manifests = sorted(path.glob("*.json"))
        if len(manifests) != 1:
            raise CuvilError(f"{path}: expected one manifest (*.json) from the compile stage, found {len(manifests)}")
        files = [manifests[0]]
    if files[0].suffix == ".json":
        try:
            manifest = json.loads(read_regular(files[0], MAX_MANIFEST, "manifest"))
        except (ValueError, RecursionError) as e:
            raise CuvilError(f"{files[0]}: not a JSON manifest: {e}") from None
        sig = manifest.get("signature") or {}
        print(f"// manifest {files[0].name}: model {manifest.get('prefix', '?')} for "
              f"{sig.get('triple', (manifest.get('target') or {}).get('triple', '?'))} "
              f"(Cuvil ABI {sig.get('abi_version', '?')}, runtime {sig.get('runtime_version', '?')}, "
              f"plugin ABI {sig.get('plugin_abi_version', '?')})")
        t = manifest.get("target") or {}
        print(f"// target: {t.get('triple', '?')} cpu={t.get('cpu', '')} features={t.get('features', '')}")
        obj = files[0].with_suffix(".o")
        files = [obj] if obj.is_file() else []
    for f in files:
        data = read_regular(f, MAX_BINARY, "file")
        arch = abi.object_arch(data) or "?"
        sigs = abi.find_signatures(data)
        print(f"// {f.name} ({arch}): " + ("no Cuvil signature" if not sigs else f"{len(sigs)} signature(s)"))
        for sig in sigs:
            print(f"//   {abi.describe(sig)}")
    return 0


def _cmd_run(args) -> int:
    from .native import run_command
    cmd = run_command(Path(args.artifact)) + list(args.args)
    os.execvp(cmd[0], cmd)


def _cmd_inspect(args) -> int:
    if not args.bundle.endswith(".cvir"):
        if args.graph:
            raise CuvilError(f"--graph draws a .cvir bundle's graph; {args.bundle} is not a .cvir bundle")
        return _print_signatures(Path(args.bundle))
    from .backend.llvm.target import resolve_target
    from .ir import print_module, read_bundle
    from .options import CompileOptions
    from .passes.pipeline import optimise

    module = read_bundle(args.bundle)
    weights = module.weights()
    params = sum(int(w.size) for w in weights.values())
    wbytes = sum(int(w.nbytes) for w in weights.values())
    if not args.raw:
        optimise(module, CompileOptions(), resolve_target(args.target, args.cpu or "", args.features or ""))
    if not args.summary:
        sys.stdout.write(print_module(module))
    fn = module.main
    counts = collections.Counter(op.name for op in fn.body.ops if op.name not in ("cuvil.constant", "cuvil.return"))
    print("// inputs: " + ", ".join(f"{n} {a.type}" for n, a in zip(fn.input_names, fn.args)))
    print("// outputs: " + ", ".join(f"{n} {v.type}" for n, v in zip(fn.output_names, fn.outputs)))
    print(f"// ops: {sum(counts.values())} (" + ", ".join(f"{k.split('.', 1)[1]} {v}" for k, v in sorted(counts.items())) + ")")
    print(f"// parameters (incl. buffers): {params} in {len(weights)} tensors ({wbytes} bytes)")
    bounds = fn.attrs.get("dim_bounds") or {}
    if bounds:
        print("// symbolic dims: " + ", ".join(f"{k} in [{lo}, {hi}]" for k, (lo, hi) in bounds.items()))
    if "arena_size" in fn.attrs:
        print(f"// arena size: {fn.attrs['arena_size']} bytes "
              f"(sum of intermediate tensors: {fn.attrs.get('intermediate_bytes', '?')} bytes)"
              + (" at the dims' upper bounds" if bounds else ""))
    if args.graph:
        from .draw import write_graph
        stage = "as captured" if args.raw else f"optimised for {args.target}"
        write_graph(module, args.graph, title=f"{Path(args.bundle).name} ({stage})")
        print(f"// graph: wrote {args.graph} ({len(fn.args) + len(fn.body.ops)} nodes)")
    return 0


def _target_arguments(s, what: str, default: str | None = None) -> None:
    s.add_argument("--target", choices=TARGET_NAMES, default=default, help=what)
    s.add_argument("--cpu", help="LLVM CPU name for the target (default: the arch's baseline)")
    s.add_argument("--features", help="LLVM feature string, e.g. +avx2,+fma")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cuvil", description="Ahead-of-time compiler for AI models.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("init", help="write a commented config template")
    s.add_argument("--template", required=True, help=f"one of: {', '.join(TEMPLATES)}")
    s.add_argument("file", help="the config file to write")
    s.add_argument("--force", action="store_true", help="overwrite an existing file")
    s.set_defaults(func=_cmd_init)

    s = sub.add_parser("build", help="capture, compile and link a config's model (cached)")
    s.add_argument("--config", required=True)
    s.add_argument("--output", required=True, help="the artifact to write")
    s.add_argument("--kind", choices=["executable", "shared", "static"], help="overrides build.artifact")
    s.add_argument("--cache-dir", help="default: .cuvil-cache next to the config")
    s.add_argument("--target", choices=TARGET_NAMES,
                   help="overrides target.arch (and selects the matching `overrides` entries)")
    s.set_defaults(func=_cmd_build)

    s = sub.add_parser("capture", help="framework model -> .cvir bundle")
    s.add_argument("--config", required=True)
    s.add_argument("--output", required=True, help="the .cvir file to write")
    s.set_defaults(func=_cmd_capture)

    s = sub.add_parser("compile", help=".cvir -> object, weights object, header, manifest (no framework)")
    s.add_argument("bundle", help="a .cvir bundle")
    s.add_argument("--config", required=True)
    s.add_argument("--output-dir", required=True)
    _target_arguments(s, "overrides target.arch")
    s.add_argument("--quantization", choices=QUANTIZATION_METHODS, help="overrides quantization.method")
    s.add_argument("--precision", choices=PRECISIONS, help="overrides precision")
    s.add_argument("--calibration", action="append", metavar="FILE",
                   help="a calibration input (.npy, .npz or image; repeat for each) instead of "
                        "quantization.calibration.files")
    s.set_defaults(func=_cmd_compile)

    s = sub.add_parser("link", help="compile-stage outputs -> executable, shared or static library")
    s.add_argument("compiled", help="the compile stage's output directory")
    s.add_argument("--kind", choices=["executable", "shared", "static"], default="executable")
    s.add_argument("--output", required=True)
    s.add_argument("--plugin", action="append", default=[], metavar="FILE",
                   help="a plugin module (.c, .o or .a) to link in (repeat for each)")
    s.set_defaults(func=_cmd_link)

    s = sub.add_parser("quant-report", help="per-layer quantization scales and errors against fp32 on the "
                                            "calibration inputs (interpreted, no native build)")
    s.add_argument("--config", required=True)
    s.add_argument("--quantization", choices=[m for m in QUANTIZATION_METHODS if m != "none"],
                   help="overrides quantization.method")
    s.add_argument("--inputs", type=int, help="compare outputs on at most this many calibration inputs")
    s.add_argument("--json", help="also write the report as JSON to this file")
    s.add_argument("--cache-dir", help="default: .cuvil-cache next to the config")
    s.set_defaults(func=_cmd_quant_report)

    s = sub.add_parser("run", help="run a built executable: natively, under qemu (aarch64) or node (wasm32)")
    s.add_argument("artifact", help="the executable (ELF or .wasm)")
    s.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    s.set_defaults(func=_cmd_run)

    s = sub.add_parser("inspect", help="print a .cvir bundle's optimised IR (with its kernel plans), op counts and "
                                       "memory plan, or the ABI signatures of a compile output directory, "
                                       "manifest, object or artifact")
    s.add_argument("bundle", help="a .cvir bundle, a compile output directory, a manifest (.json) or a binary")
    s.add_argument("--raw", action="store_true", help="print the IR as captured, before the passes")
    s.add_argument("--summary", action="store_true", help="print only the summary lines")
    s.add_argument("--graph", metavar="FILE", help="also draw the graph (ops with shapes, fused epilogues, kernel "
                                                   "plans, arena offsets) with Graphviz: FILE.svg, .png, or .dot text")
    _target_arguments(s, "choose kernels and plan memory for this target (default: host, this machine)",
                      default="host")
    s.set_defaults(func=_cmd_inspect)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CuvilError as e:
        print(f"cuvil: error: {e}", file=sys.stderr)
        return 1
    except FileNotFoundError as e:
        print(f"cuvil: error: {e.filename or e}: no such file", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cuvil: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
