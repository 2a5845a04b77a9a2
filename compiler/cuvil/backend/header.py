"""The generated `<prefix>.h`: one model's plain C API over the runtime.

The header declares the prefixed API (`<prefix>_create`, `_run`, `_run_with_scratch`,
metadata queries, `_destroy`) and holds the model's metadata as `static const` data,
so the headers of two models can be included in one translation unit. The function
bodies are in the header too, behind `#ifdef <PREFIX>_IMPLEMENTATION`: exactly one
C file of an artifact defines that macro (the glue `cuvil.native` generates), every
other user just includes the header. The bodies only forward to the generic
runtime (`cuvil_ctx_create(&<prefix>_model, ...)`).

The text is a pure function of the manifest: same manifest, same bytes.
"""
from __future__ import annotations

import re

from ..errors import CuvilError
from ..ir import symdim

# manifest dtype -> (C enum, element size)
DTYPES = {
    "f32": ("CUVIL_F32", 4), "f16": ("CUVIL_F16", 2), "f64": ("CUVIL_F64", 8), "i64": ("CUVIL_I64", 8),
    "i32": ("CUVIL_I32", 4), "i8": ("CUVIL_I8", 1), "u8": ("CUVIL_U8", 1), "bool": ("CUVIL_BOOL", 1),
}
MANIFEST_FORMAT = "cuvil-manifest-1"
MAX_RANK = 8  # CUVIL_MAX_RANK
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INT64_MAX = 2**63 - 1


def _fail(key: str, msg: str) -> CuvilError:
    return CuvilError(f"manifest: {key}: {msg}")


def _bounds(manifest) -> dict:
    return {d["name"]: (d["min"], d["max"]) for d in manifest.get("dims") or []}


def _check_dims(manifest) -> None:
    dims = manifest.get("dims") or []
    if not isinstance(dims, list) or len(dims) > 16:
        raise _fail("dims", f"must be a list of at most 16 symbolic dims, got {dims!r}")
    seen = set()
    for i, d in enumerate(dims):
        ok = isinstance(d, dict) and isinstance(d.get("name"), str) and _IDENT.match(d["name"]) and \
            all(isinstance(d.get(k), int) and not isinstance(d.get(k), bool) for k in ("min", "max"))
        if not ok or not 0 <= d["min"] <= d["max"] or d["name"] in seen:  # min 0: a data-dependent size
            raise _fail(f"dims[{i}]", f"must be {{name, min, max}} with 0 <= min <= max and a unique C "
                        f"identifier name, got {d!r}")
        seen.add(d["name"])


def _check_tensor(t, key: str, bounds: dict | None = None, plain: bool = False) -> None:
    if not isinstance(t, dict):
        raise _fail(key, "must be an object with name, shape and dtype")
    name, shape, dtype = t.get("name"), t.get("shape"), t.get("dtype")
    if not isinstance(name, str) or not name or "\0" in name:
        raise _fail(f"{key}.name", f"must be a non-empty string, got {name!r}")
    if dtype not in DTYPES:
        raise _fail(f"{key}.dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or len(shape) > MAX_RANK:
        raise _fail(f"{key}.shape", f"must be a list of at most {MAX_RANK} dims, got {shape!r}")
    count = 1
    bounds = bounds or {}
    for d in shape:
        if isinstance(d, str):
            try:
                syms = symdim.symbols(d)
            except Exception:
                raise _fail(f"{key}.shape", f"bad symbolic dim {d!r}") from None
            if not syms <= set(bounds) or (plain and symdim.parse(d) != {(d,): 1}):
                raise _fail(f"{key}.shape", f"the dim {d!r} must be " + ("one of the symbolic dims "
                            if plain else "made of the symbolic dims ") + f"{sorted(bounds)}")
            d = symdim.upper_bound(d, bounds)
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise _fail(f"{key}.shape", f"dims must be non-negative integers or symbolic dims, got {shape!r}")
        count *= d
    if count * DTYPES[dtype][1] > _INT64_MAX:
        raise _fail(f"{key}.shape", f"{shape} holds more than 2**63 bytes")


def check_manifest(manifest) -> None:
    """Raise CuvilError naming the key of the first thing wrong with `manifest`."""
    if not isinstance(manifest, dict):
        raise CuvilError("manifest: must be a JSON object")
    if manifest.get("format") != MANIFEST_FORMAT:
        raise _fail("format", f"expected {MANIFEST_FORMAT!r}, got {manifest.get('format')!r}")
    prefix = manifest.get("prefix")
    if not isinstance(prefix, str) or not _IDENT.match(prefix):
        raise _fail("prefix", f"must be a C identifier, got {prefix!r}")
    arena = manifest.get("arena_size")
    if isinstance(arena, bool) or not isinstance(arena, int) or not 0 <= arena <= _INT64_MAX:
        raise _fail("arena_size", f"must be a non-negative integer, got {arena!r}")
    _check_dims(manifest)
    bounds = _bounds(manifest)
    for kind in ("inputs", "outputs"):
        tensors = manifest.get(kind)
        if not isinstance(tensors, list):
            raise _fail(kind, "must be a list")
        names = set()
        for i, t in enumerate(tensors):
            _check_tensor(t, f"{kind}[{i}]", bounds, plain=kind == "inputs")
            if t["name"] in names:
                raise _fail(f"{kind}[{i}].name", f"{t['name']!r} appears twice")
            names.add(t["name"])
    if not manifest["outputs"]:
        raise _fail("outputs", "a model needs at least one output")


def c_string(s: str) -> str:
    """A C string literal for `s` (UTF-8; octal escapes for anything not plain ASCII)."""
    out = []
    for b in s.encode("utf-8"):
        ch = chr(b)
        if ch in '"\\?':  # '?' too: no trigraphs
            out.append("\\" + ch)
        elif 0x20 <= b < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _count(t: dict, bounds: dict) -> int:
    n = 1
    for d in t["shape"]:
        n *= symdim.upper_bound(d, bounds)
    return n


def _c_dim(d, index: dict) -> str:
    """A dim as a C expression over `d[k]`, the symbols' values."""
    if isinstance(d, int):
        return str(d)
    terms = []
    for key, coeff in sorted(symdim.parse(d).items()):
        factors = ([] if coeff == 1 and key else [f"(int64_t){coeff}"]) + [f"d[{index[s]}]" for s in key]
        terms.append(" * ".join(factors))
    return " + ".join(terms).replace("+ (int64_t)-", "- (int64_t)")


def _dims_tables(p: str, manifest: dict) -> list[str]:
    """The symbolic dims: their bounds, which input dim is which, and the shapes function."""
    dims = manifest.get("dims") or []
    if not dims:
        return []
    index = {d["name"]: k for k, d in enumerate(dims)}
    lines = [f"static const cuvil_dim_desc {p}_dims[{len(dims)}] = {{"]
    lines += [f"    {{{c_string(d['name'])}, {d['min']}, {d['max']}}}," for d in dims]
    lines.append("};")
    syms = [index[d] if isinstance(d, str) else -1 for t in manifest["inputs"] for d in t["shape"]]
    lines.append(f"static const int32_t {p}_input_dim_symbols[{max(len(syms), 1)}] = "
                 f"{{{', '.join(map(str, syms or [-1]))}}};")
    lines.append(f"static void {p}_shapes(const int64_t *d, int64_t *s) {{")
    k = 0
    for t in manifest["inputs"] + manifest["outputs"]:
        for d in t["shape"]:
            lines.append(f"    s[{k}] = {_c_dim(d, index)};")
            k += 1
    lines += ["    (void)d;", "    (void)s;", "}"]
    return lines


def _tensor_table(prefix: str, kind: str, tensors: list[dict], bounds: dict) -> list[str]:
    lines = []
    for i, t in enumerate(tensors):
        if t["shape"]:
            dims = ", ".join(str(symdim.upper_bound(d, bounds)) for d in t["shape"])
            lines.append(f"static const int64_t {prefix}_{kind}{i}_shape[{len(t['shape'])}] = {{{dims}}};")
    if not tensors:
        return lines
    lines.append(f"static const cuvil_tensor_desc {prefix}_{kind}s[{len(tensors)}] = {{")
    for i, t in enumerate(tensors):
        shape = f"{prefix}_{kind}{i}_shape" if t["shape"] else "NULL"
        n = _count(t, bounds)
        lines.append(f"    {{{c_string(t['name'])}, {DTYPES[t['dtype']][0]}, {len(t['shape'])}, {shape}, "
                     f"{n}, {n * DTYPES[t['dtype']][1]}u}},")
    lines.append("};")
    return lines


def _describe(t: dict) -> str:
    """`name: f32[1, 3]` for a comment (the name as a C literal, so no `*/` can end it)."""
    name = c_string(t["name"]).replace("*/", "*\\/")
    return f"{name}: {t['dtype']}[{', '.join(str(d) for d in t['shape'])}]"


def render_header(manifest: dict) -> str:
    """The text of `<prefix>.h` for a compile-stage manifest (see module docstring)."""
    check_manifest(manifest)
    p = manifest["prefix"]
    P = p.upper()
    lines = [*_usage_comment(manifest), f"#ifndef CUVIL_MODEL_{P}_H", f"#define CUVIL_MODEL_{P}_H", "",
             "#include <stddef.h>", "#include <stdint.h>", "", '#include "cuvil_runtime.h"', "",
             "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
             *_model_description(manifest), *_declarations(p), "", f"#ifdef {P}_IMPLEMENTATION",
             *_definitions(p, len(manifest["inputs"]), len(manifest["outputs"])), f"#endif /* {P}_IMPLEMENTATION */",
             "", "#ifdef __cplusplus", "}", "#endif", "", f"#endif /* CUVIL_MODEL_{P}_H */", ""]
    return "\n".join(lines)


def _usage_comment(manifest: dict) -> list[str]:
    """The header's opening comment: how to call the model, its tensors and dims."""
    p = manifest["prefix"]
    dims = manifest.get("dims") or []
    doc_dims = "".join(f"\n *   {d['name']} in [{d['min']}, {d['max']}]" for d in dims)
    doc_ins = "".join(f"\n *   {_describe(t)}" for t in manifest["inputs"]) or "\n *   (none)"
    doc_outs = "".join(f"\n *   {_describe(t)}" for t in manifest["outputs"])
    return [
        f"/* {p}.h: C API of the model '{p}', generated by Cuvil from its manifest. Do not edit.",
        " *",
        f" *   {p}_ctx *ctx;",
        f" *   if ({p}_create(&ctx) != CUVIL_OK) puts(cuvil_last_error());",
        f" *   const void *in[] = {{...}};  void *out[] = {{...}};   (manifest order, row-major)",
        f" *   cuvil_status st = {p}_run(ctx, in, out);",
        f" *   {p}_destroy(ctx);",
        " *",
        f" * Inputs:{doc_ins}",
        f" * Outputs:{doc_outs}",
        *([" *", f" * Symbolic dims (any value within the bounds; {p}_set_input_shape() sets them,",
           f" * {p}_ctx_output_shape() gives the resulting output shapes; buffers and the arena",
           f" * are sized for the upper bounds):{doc_dims}"] if dims else []),
        " *",
        " * One context per thread (weights are shared, read-only). Every call returns a",
        " * cuvil_status (or the value asked for); cuvil_status_message() and",
        " * cuvil_last_error() say what went wrong. Link with -lm -lpthread.",
        " */",
    ]


def _model_description(manifest: dict) -> list[str]:
    """The sizes, the forward function and signature, and the static model descriptor."""
    p = manifest["prefix"]
    P = p.upper()
    ins, outs = manifest["inputs"], manifest["outputs"]
    bounds = _bounds(manifest)
    dims = manifest.get("dims") or []
    dyn = bool(dims)
    return [
        f"#define {P}_ARENA_SIZE ((size_t){manifest['arena_size']}u)",
        f"#define {P}_INPUT_COUNT {len(ins)}",
        f"#define {P}_OUTPUT_COUNT {len(outs)}",
        "",
        f"typedef struct cuvil_ctx {p}_ctx;",
        "",
        "/* Defined by the model's object file: the code and its ABI signature (target",
        " * triple, Cuvil ABI and runtime version), which the runtime checks when a context",
        " * is created (weak: an object made without one links, unchecked). */",
        (f"void {p}_forward(void **inputs, void **outputs, uint8_t *arena, int64_t *dims);" if dyn else
         f"void {p}_forward(void **inputs, void **outputs, uint8_t *arena);"),
        f"extern const char {p}_signature[] CUVIL_WEAK;",
        "",
        *_tensor_table(p, "input", ins, bounds),
        *_tensor_table(p, "output", outs, bounds),
        *_dims_tables(p, manifest),
        f"static const cuvil_model_desc {p}_model = {{",
        f"    CUVIL_ABI_VERSION, {c_string(p)}, {P}_ARENA_SIZE,",
        f"    {len(ins)}, {f'{p}_inputs' if ins else 'NULL'}, {len(outs)}, {p}_outputs, "
        f"{'NULL' if dyn else p + '_forward'},",
        (f"    {p}_signature, {len(dims)}, {p}_dims, {p}_input_dim_symbols, {p}_forward, {p}_shapes}};" if dyn
         else f"    {p}_signature, 0, NULL, NULL, NULL, NULL}};"),
        "",
    ]


def _declarations(p: str) -> list[str]:
    """The model's C API functions."""
    lines = [
        "/* A context with its own 64-byte aligned arena of ARENA_SIZE bytes. */",
        f"CUVIL_EXPORT cuvil_status {p}_create({p}_ctx **out);",
        f"CUVIL_EXPORT cuvil_status {p}_destroy({p}_ctx *ctx);",
        "/* Threads for this context's runs (default 1). */",
        f"CUVIL_EXPORT cuvil_status {p}_set_threads({p}_ctx *ctx, int threads);",
        f"CUVIL_EXPORT cuvil_status {p}_run({p}_ctx *ctx, const void *const *inputs, void *const *outputs);",
        "/* A run in caller-owned memory: `scratch` is 64-byte aligned and holds ARENA_SIZE",
        " * bytes; it uses the calling thread's cuvil_set_num_threads() count. */",
        f"CUVIL_EXPORT cuvil_status {p}_run_with_scratch(void *scratch, size_t scratch_size, "
        "const void *const *inputs,",
        "                                             void *const *outputs);",
        f"CUVIL_EXPORT const cuvil_model_desc *{p}_model_desc(void);",
        "/* Input i's shape for this context's next runs (symbolic dims within their bounds),",
        " * and an output's shape for the input shapes set last. */",
        f"CUVIL_EXPORT cuvil_status {p}_set_input_shape({p}_ctx *ctx, int i, const int64_t *dims, int rank);",
        f"CUVIL_EXPORT cuvil_status {p}_ctx_output_shape(const {p}_ctx *ctx, int i, int64_t *dims, int max_dims);",
    ]
    for kind in ("input", "output"):
        lines += [
            f"CUVIL_EXPORT int {p}_{kind}_count(void);",
            f"/* NULL, -1, CUVIL_DTYPE_INVALID or 0 for an index out of range. */",
            f"CUVIL_EXPORT const char *{p}_{kind}_name(int i);",
            f"CUVIL_EXPORT int {p}_{kind}_rank(int i);",
            f"CUVIL_EXPORT cuvil_status {p}_{kind}_shape(int i, int64_t *dims, int max_dims);",
            f"CUVIL_EXPORT cuvil_dtype {p}_{kind}_dtype(int i);",
            f"CUVIL_EXPORT size_t {p}_{kind}_nbytes(int i);",
        ]
    return lines


def _definitions(p: str, n_ins: int, n_outs: int) -> list[str]:
    """The C API's definitions (compiled where <PREFIX>_IMPLEMENTATION is defined)."""
    lines = [
        f"cuvil_status {p}_create({p}_ctx **out) {{ return cuvil_ctx_create(&{p}_model, out); }}",
        f"cuvil_status {p}_destroy({p}_ctx *ctx) {{ return cuvil_ctx_destroy(ctx); }}",
        f"cuvil_status {p}_set_threads({p}_ctx *ctx, int threads) {{ return cuvil_ctx_set_threads(ctx, threads); }}",
        f"cuvil_status {p}_run({p}_ctx *ctx, const void *const *inputs, void *const *outputs) {{",
        "    return cuvil_ctx_run(ctx, inputs, outputs);",
        "}",
        f"cuvil_status {p}_run_with_scratch(void *scratch, size_t scratch_size, const void *const *inputs,",
        "                                  void *const *outputs) {",
        f"    return cuvil_run_with_scratch(&{p}_model, scratch, scratch_size, inputs, outputs);",
        "}",
        f"const cuvil_model_desc *{p}_model_desc(void) {{ return &{p}_model; }}",
        f"cuvil_status {p}_set_input_shape({p}_ctx *ctx, int i, const int64_t *dims, int rank) {{",
        "    return cuvil_ctx_set_input_shape(ctx, i, dims, rank);",
        "}",
        f"cuvil_status {p}_ctx_output_shape(const {p}_ctx *ctx, int i, int64_t *dims, int max_dims) {{",
        "    return cuvil_tensor_shape(cuvil_ctx_tensor(ctx, 1, i), dims, max_dims);",
        "}",
    ]
    for kind, is_out in (("input", 0), ("output", 1)):
        t = f"cuvil_model_tensor(&{p}_model, {is_out}, i)"
        count = n_outs if is_out else n_ins
        lines += [
            f"int {p}_{kind}_count(void) {{ return {count}; }}",
            f"const char *{p}_{kind}_name(int i) {{ return {t} ? {t}->name : NULL; }}",
            f"int {p}_{kind}_rank(int i) {{ return {t} ? {t}->rank : -1; }}",
            f"cuvil_status {p}_{kind}_shape(int i, int64_t *dims, int max_dims) {{",
            f"    return cuvil_tensor_shape({t}, dims, max_dims);",
            "}",
            f"cuvil_dtype {p}_{kind}_dtype(int i) {{ return {t} ? {t}->dtype : CUVIL_DTYPE_INVALID; }}",
            f"size_t {p}_{kind}_nbytes(int i) {{ return {t} ? (size_t){t}->nbytes : 0; }}",
        ]
    return lines
