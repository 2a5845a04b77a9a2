"""The `cuvil` command line.

    cuvil inspect model.cvir          print the optimised IR and the memory plan
"""
from __future__ import annotations

import argparse
import sys

from .errors import CuvilError


def _cmd_inspect(args) -> int:
    from .ir import print_module, read_bundle
    from .backend.llvm.kernels import scratch_bytes
    from .passes.pipeline import default_pipeline, run_pipeline

    module = read_bundle(args.bundle)
    weights = module.weights()
    if not args.raw:
        run_pipeline(module, default_pipeline(memory_plan={"scratch": scratch_bytes}))
    if not args.summary:
        sys.stdout.write(print_module(module))
    fn = module.main
    ops = [op for op in fn.body.ops if op.name not in ("cuvil.constant", "cuvil.return")]
    print(f"// inputs: " + ", ".join(f"{n} {a.type}" for n, a in zip(fn.input_names, fn.args)))
    print(f"// outputs: " + ", ".join(f"{n} {v.type}" for n, v in zip(fn.output_names, fn.outputs)))
    print(f"// ops: {len(ops)}; weights: {len(weights)} tensors, "
          f"{sum(w.nbytes for w in weights.values())} bytes")
    if "arena_size" in fn.attrs:
        print(f"// arena size: {fn.attrs['arena_size']} bytes "
              f"(sum of intermediate tensors: {fn.attrs.get('intermediate_bytes', '?')} bytes)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cuvil", description="Ahead-of-time compiler for AI models.")
    sub = p.add_subparsers(dest="command", required=True)
    ins = sub.add_parser("inspect", help="print a .cvir bundle's optimised IR and memory plan")
    ins.add_argument("bundle", help="path of a .cvir bundle")
    ins.add_argument("--raw", action="store_true", help="print the IR as captured, before the passes")
    ins.add_argument("--summary", action="store_true", help="print only the summary lines")
    ins.set_defaults(func=_cmd_inspect)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CuvilError as e:
        print(f"cuvil: error: {e}", file=sys.stderr)
        return 1
    except FileNotFoundError as e:
        print(f"cuvil: error: {e.filename}: no such file", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
