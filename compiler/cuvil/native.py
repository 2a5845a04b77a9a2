"""The link stage: a model's objects + the C runtime (+ plugins) -> executable, shared or
static library, with the C toolchain of the model's target (`toolchain_for`):

    x86_64-unknown-linux-gnu   $CC or cc
    aarch64-unknown-linux-gnu  aarch64-linux-gnu-gcc (Debian gcc-aarch64-linux-gnu), or $CUVIL_CC_AARCH64
    wasm32-unknown-wasi        clang --target=wasm32-wasi + wasm-ld + wasi-libc (Debian clang,
                               lld, wasi-libc, libclang-rt-14-dev-wasm32), or $CUVIL_CC_WASM32;
                               executables only (a .wasm command module) and static libraries

Before linking, the ABI signatures (cuvil.runtime.abi) of the model object, the runtime
as compiled by that toolchain and every plugin module are compared: another target or
ABI version is a LinkError that names both sides.

`link_artifact` needs only the compile stage's manifest (a dict, see DESIGN.md §1 and
`cuvil.backend.header`), the objects (model.o, weights.o) and the model's header. It
compiles the runtime's C sources with `cc` and a generated glue file (glue.py) that
defines the header's prefixed API (and, for an executable, the pre/post-processing
tables main reads), then links (the runtime's objects are compiled once per process for each
compiler, flag set and content of the runtime sources, and reused):

    exe     runtime + main + model; libjpeg, libpng and zlib linked statically when an
            input has image pre-processing (every target: Debian's x86_64 and arm64
            archives, wasm32 ones built by cuvil.wasm_codecs); otherwise only -lm -lpthread
    shared  lib<prefix>.so exporting the prefixed API and the runtime's public calls
    static  an archive of the runtime, the API glue and the model objects

Outputs appear atomically (temporary file, then rename) and do not depend on where
the build ran: compiler paths are mapped with -ffile-prefix-map, archives are
written with `ar D` (no timestamps or owners).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import wasm_codecs
from .backend.header import check_manifest, render_header
from .backend.llvm.target import Target
from .errors import CuvilError, LinkError
from .glue import processing, render_glue, used_plugins
from .runtime import CORE_SOURCES, EXE_SOURCES, RUNTIME_DIR, abi

KINDS = ("exe", "shared", "static")
CODEC_ARCHIVES = ("libjpeg.a", "libpng16.a", "libz.a")  # in link order
CODEC_PACKAGES = "libjpeg62-turbo-dev libpng-dev zlib1g-dev"
WASM32_CODECS = "libjpeg-turbo, libpng and zlib built for wasm32-wasi (make setup: python -m cuvil.wasm_codecs)"


def runtime_hash() -> str:
    """Hash of the C runtime's sources (*.c, *.h): part of the link stage's cache key and
    of the key under which compiled runtime objects are reused."""
    h = hashlib.sha256()
    for p in sorted(RUNTIME_DIR.rglob("*.[ch]")):
        h.update(str(p.relative_to(RUNTIME_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    except OSError as exc:
        raise LinkError(f"{what}: cannot run {cmd[0]!r}: {exc}") from exc
    if proc.returncode != 0:
        raise LinkError(f"{what} failed (exit {proc.returncode}):\n  {shlex.join(cmd)}\n{proc.stderr.strip()}")
    return proc.stdout


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """How to compile and link C for one target."""
    triple: str
    cc: tuple[str, ...]              # the compiler driver (with its target arguments)
    flags: tuple[str, ...]           # code generation flags for every C file
    link_flags: tuple[str, ...]
    libs: tuple[str, ...]
    ar: tuple[str, ...]
    kinds: tuple[str, ...]           # artifact kinds this target can make
    packages: str                    # the Debian packages that provide it
    codec_packages: str = ""         # static libjpeg/libpng/zlib for this target ("" none)

    @property
    def arch(self) -> str:
        return Target(self.triple).arch

    def check_kind(self, kind: str) -> None:
        if kind not in self.kinds:
            names = {"exe": "executables", "shared": "shared libraries", "static": "static libraries"}
            raise LinkError(f"{self.triple}: Cuvil does not build {names[kind]} for this target "
                            f"(it builds {', '.join(names[k] for k in self.kinds)})")

    def check_installed(self) -> None:
        if shutil.which(self.cc[0]) is None:
            raise LinkError(f"cannot run the C compiler {self.cc[0]!r} for {self.triple}: not found; install "
                            f"{self.packages} (make setup)")


_ELF_FLAGS = ("-fPIC", "-pthread")
_ELF_LIBS = ("-lm", "-lpthread")


def toolchain_for(target: Target | str, cc: str | None = None) -> Toolchain:
    """The C toolchain for a target (a backend.llvm.target.Target, or its LLVM triple as
    a manifest records it); `cc` (a command, may carry arguments) replaces the compiler
    driver."""
    target = target if isinstance(target, Target) else Target(target)
    triple, arch = target.triple, target.arch
    if arch == "x86_64":
        cmd = shlex.split(cc or os.environ.get("CC") or "cc")
        return Toolchain(triple, tuple(cmd), _ELF_FLAGS, (), _ELF_LIBS, (), KINDS, "gcc", CODEC_PACKAGES)
    if arch == "aarch64":
        cmd = shlex.split(cc or os.environ.get("CUVIL_CC_AARCH64") or "aarch64-linux-gnu-gcc")
        return Toolchain(triple, tuple(cmd), _ELF_FLAGS, (), _ELF_LIBS, ("aarch64-linux-gnu-ar",), KINDS,
                         "gcc-aarch64-linux-gnu libc6-dev-arm64-cross",
                         "libjpeg62-turbo-dev:arm64 libpng-dev:arm64 zlib1g-dev:arm64")
    if arch == "wasm32":
        clang = "clang" if shutil.which("clang") or not shutil.which("clang-14") else "clang-14"
        cmd = shlex.split(cc or os.environ.get("CUVIL_CC_WASM32") or f"{clang} --target=wasm32-wasi")
        ar = "llvm-ar" if shutil.which("llvm-ar") else "llvm-ar-14"
        return Toolchain(triple, tuple(cmd), (), ("-Wl,-z,stack-size=1048576",), ("-lm",), (ar,),
                         ("exe", "static"), "clang lld wasi-libc libclang-rt-14-dev-wasm32", WASM32_CODECS)
    raise LinkError(f"no C toolchain for the target {triple!r} (supported: x86_64, aarch64, wasm32)")


def check_image_support(tool: Toolchain) -> list[str]:
    """The static codec archives image inputs link for this target, or a clear error."""
    if not tool.codec_packages:
        raise LinkError(f"image pre-processing (JPEG/PNG decoding) is not available for {tool.triple}: give the "
                        "executable .npy inputs or decode with a pre-processing plugin "
                        "(see examples/plugins/ppm_image.c)")
    tool.check_installed()
    if tool.arch == "wasm32":
        lib = wasm_codecs.codec_dir() / "lib"
        missing = [a for a in CODEC_ARCHIVES if not (lib / a).is_file()]
        if missing:
            raise LinkError(f"{', '.join(missing)} for wasm32-wasi not found in {lib}: image inputs link libjpeg, "
                            "libpng and zlib statically; build them with `python -m cuvil.wasm_codecs` (make setup "
                            "does; $CUVIL_WASM32_CODECS names another directory)")
        return [str(lib / a) for a in CODEC_ARCHIVES]
    return _static_archives(list(tool.cc), tool)


def image_flags(tool: Toolchain) -> tuple[list[str], list[str]]:
    """Extra (compiler flags, runtime sources) of an executable that decodes images: on
    wasm32 the codecs' headers, clang's setjmp/longjmp lowering and its helpers (see
    cuvil.wasm_codecs)."""
    if tool.arch != "wasm32":
        return [], []
    include = wasm_codecs.codec_dir() / "include"
    return [*wasm_codecs.SJLJ_FLAGS, "-I", str(include), "-I", str(wasm_codecs.SETJMP_DIR)], ["cuvil_wasm_sjlj.c"]


def _static_archives(cc: list[str], tool: Toolchain | None = None) -> list[str]:
    found = []
    for name in CODEC_ARCHIVES:
        path = _run([*cc, f"-print-file-name={name}"], f"looking for {name}").strip()
        if not os.path.isabs(path) or not os.path.isfile(path):
            if tool is not None and tool.arch != "x86_64":
                raise LinkError(f"{name} for {tool.triple} not found by {shlex.join(cc)}: image inputs link "
                                f"libjpeg, libpng and zlib statically, and these are not installed for this target "
                                f"(make setup installs them; Debian: dpkg --add-architecture arm64; apt-get install "
                                f"{tool.codec_packages})")
            raise LinkError(f"{name} not found by {shlex.join(cc)}: image inputs link libjpeg, libpng and zlib "
                            f"statically; install {CODEC_PACKAGES} (make setup)")
        found.append(path)
    return found


def _side(sig: dict, who: str) -> str:
    extra = f", plugin ABI {sig['plugin_abi']}" if "plugin_abi" in sig else ""
    return (f"{who} for {sig.get('triple', '?')} (Cuvil ABI {sig.get('abi', '?')}{extra}, "
            f"runtime {sig.get('runtime', '?')})")


def check_signatures(manifest: dict, objects: Sequence[Path], runtime_obj: Path, plugin_objs: Sequence[Path],
                     plugin_names: Sequence[str], cc: str) -> dict[str, Path]:
    """Compare the ABI signatures of everything about to be linked (see module docstring).
    Returns plugin name -> module. Raises LinkError naming both sides of a mismatch."""
    prefix = manifest["prefix"]
    runtime = next((s for s in abi.find_signatures(runtime_obj.read_bytes()) if s["kind"] == "runtime"), None)
    if runtime is None:
        raise LinkError(f"the runtime compiled by {cc!r} carries no ABI signature")
    runtime_side = _side(runtime, f"the Cuvil runtime compiled by {cc!r}")
    want_arch = Target(manifest["target"]["triple"]).arch
    for o in objects:
        data = o.read_bytes()
        arch = abi.object_arch(data)
        if arch is not None and arch != want_arch:
            raise LinkError(f"cannot link {o.name}: it is {arch} code, but the manifest of model '{prefix}' says "
                            f"{manifest['target']['triple']}")
        for sig in abi.find_signatures(data):
            if sig["kind"] != "model":
                continue
            if sig["triple"] != runtime["triple"] or sig.get("abi") != runtime.get("abi"):
                model_side = _side(sig, f"the model '{sig.get('name', prefix)}' ({o.name})")
                raise LinkError(f"cannot link {model_side} with {runtime_side}: rebuild the model with this Cuvil "
                                "for the same target, or use that target's C toolchain")
    found: dict[str, Path] = {}
    for path in plugin_objs:
        sigs = [s for s in abi.find_signatures(path.read_bytes()) if s["kind"] == "plugin"]
        if not sigs:
            raise LinkError(f"plugin module {path.name} has no Cuvil plugin signature: define its descriptor with "
                            "CUVIL_PLUGIN(name, ...) from cuvil_plugin.h")
        for sig in sigs:
            if sig["triple"] != runtime["triple"] or sig.get("abi") != runtime.get("abi") or \
                    sig.get("plugin_abi") != str(abi.PLUGIN_ABI_VERSION):
                who = f"plugin '{sig.get('name', '?')}' ({path.name})"
                theirs = _side(sig, who)
                ours = _side(dict(runtime, plugin_abi=str(abi.PLUGIN_ABI_VERSION)),
                             f"model '{prefix}' and the Cuvil runtime compiled by {cc!r}")
                raise LinkError(f"refusing {theirs}: this link is {ours}; rebuild the plugin against this "
                                "Cuvil's cuvil_plugin.h with the target's C toolchain")
            found.setdefault(sig["name"], path)
    missing = [n for n in plugin_names if n not in found]
    if missing:
        raise LinkError(f"model '{prefix}' uses the plugin(s) {', '.join(missing)}, which no plugin module defines "
                        f"(defined: {', '.join(sorted(found)) or 'none'})")
    return found


def link_artifact(kind: str, objects: Sequence[str | os.PathLike], manifest: dict,
                  header_path: str | os.PathLike | None, out: str | os.PathLike, *,
                  cc: str | None = None, workdir: str | os.PathLike | None = None,
                  plugins: Sequence[str | os.PathLike] = ()) -> Path:
    """Link `objects` (model.o, weights.o) with the runtime and `plugins` into `out`
    (see module docstring).

    `header_path` is the model's `<prefix>.h` (None: render it from the manifest into
    the work directory). `cc` replaces the target's C compiler and may carry arguments
    ("ccache gcc", "clang --target=..."); default: `toolchain_for` the manifest's
    triple. `plugins` are C files (compiled here), objects or archives of plugin
    modules. `workdir` keeps the intermediate files (default: a temporary directory).
    Raises LinkError (with the command and its stderr) when the toolchain fails or the
    ABI signatures disagree, and CuvilError naming the manifest key when the manifest
    is wrong.
    """
    if kind not in KINDS:
        raise LinkError(f"unknown artifact kind {kind!r}: expected one of {', '.join(KINDS)}")
    check_manifest(manifest)
    pre, _ = processing(manifest)
    needed_plugins = used_plugins(manifest) if kind == "exe" else []
    out = Path(out)
    if not out.parent.is_dir():
        raise LinkError(f"cannot link {out}: directory {out.parent} does not exist")
    objects = [Path(o) for o in objects]
    plugins = [Path(p_).resolve() for p_ in plugins]
    for o in objects + plugins:
        if not o.is_file():
            raise LinkError(f"cannot link {out}: {'plugin module' if o in plugins else 'object'} {o} does not exist")
    triple = (manifest.get("target") or {}).get("triple") or "x86_64-unknown-linux-gnu"
    if cc is not None and not shlex.split(cc):
        raise LinkError("no C compiler given (cc is empty)")
    tool = toolchain_for(triple, cc)
    tool.check_kind(kind)
    tool.check_installed()
    with contextlib.ExitStack() as stack:
        if workdir is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cuvil-link-")))
        else:
            work = Path(workdir)
            work.mkdir(parents=True, exist_ok=True)
        work = work.resolve()
        if header_path is None:
            header = work / f"{manifest['prefix']}.h"
            header.write_text(render_header(manifest))
        else:
            header = Path(header_path).resolve()
            if not header.is_file():
                raise LinkError(f"cannot link {out}: header {header_path} does not exist")
        images = kind == "exe" and any(cfg is not None and cfg.get("kind") != "plugin" for cfg in pre)
        archives = check_image_support(tool) if images else []
        members = _compile_members(kind, manifest, tool, work, header, out, objects, plugins, needed_plugins, images)
        _write_artifact(kind, tool, work, out, *members, archives)
    return out


def _compile_members(kind: str, manifest: dict, tool: Toolchain, work: Path, header: Path, out: Path,
                     objects: list[Path], plugins: list[Path], needed_plugins: list[str],
                     images: bool) -> tuple[list[str], list[str]]:
    """Compile the runtime, the plugins' C files and the glue into `work`, copy the model
    objects there and check every signature (`needed_plugins` must be defined); (the
    compiled members, the model's)."""
    ccmd, prefix = list(tool.cc), manifest["prefix"]
    # The runtime's own flags (its objects depend on nothing else: they are reused
    # within the process), then those of the files that include the model's header.
    base = ["-std=c99", "-O2", *tool.flags, f"-ffile-prefix-map={RUNTIME_DIR}=cuvil/runtime"]
    if kind == "shared":
        base.append("-fvisibility=hidden")
    if kind == "exe" and not images:
        base.append("-DCUVIL_NO_CODECS")
    extra_flags, extra_sources = image_flags(tool) if kind == "exe" and images else ([], [])
    base += extra_flags
    flags = [*base, f"-ffile-prefix-map={work}=.", f"-ffile-prefix-map={header.parent}=.",
             "-I", str(header.parent), "-I", str(RUNTIME_DIR)]
    sources = [RUNTIME_DIR / s for s in CORE_SOURCES + (EXE_SOURCES if kind == "exe" else ()) + tuple(extra_sources)]
    runtime = runtime_hash()
    compiled = []
    for src in sources:
        obj = work / (src.stem + ".o")
        _runtime_object(ccmd, base, runtime, src, obj, f"compiling {src.name} for {out}")
        compiled.append(obj.name)
    plugin_objs = []
    for i, src in enumerate(plugins):
        name = f"plugin{i}_{src.stem}{'.a' if src.suffix == '.a' else '.o'}"
        if src.suffix == ".c":
            pflags = [f for f in flags if f != "-std=c99"] + [f"-ffile-prefix-map={src.parent}=plugins"]
            _run([*ccmd, *pflags, "-c", str(src), "-o", name], f"compiling plugin {src.name} for {out}", cwd=work)
        else:
            shutil.copyfile(src, work / name)
        plugin_objs.append(work / name)
    model_objs = []
    for i, o in enumerate(objects):  # fixed member names: the archive must not depend on the caller's paths
        name = f"{prefix}_{i}_{o.name}"
        shutil.copyfile(o, work / name)
        model_objs.append(name)
    found = check_signatures(manifest, [work / n for n in model_objs], work / "cuvil_runtime.o", plugin_objs,
                             needed_plugins, shlex.join(ccmd))
    glue = work / f"{prefix}_glue.c"
    glue.write_text(render_glue(manifest, header.name, app=kind == "exe", plugins=sorted(found)))
    _run([*ccmd, *flags, "-c", str(glue), "-o", glue.stem + ".o"], f"compiling {glue.name} for {out}", cwd=work)
    compiled.append(glue.stem + ".o")
    compiled += [p_.name for p_ in plugin_objs]
    return compiled, model_objs


def _write_artifact(kind: str, tool: Toolchain, work: Path, out: Path, compiled: list[str], model_objs: list[str],
                    archives: list[str]) -> None:
    """Archive or link the members in `work` into `out`, atomically (a temporary file
    next to it, then a rename)."""
    ccmd = list(tool.cc)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if kind == "static":
            tmp.unlink()  # ar appends to an existing file
            ar = list(tool.ar) or [_run([*ccmd, "-print-prog-name=ar"], "looking for ar").strip() or "ar"]
            members = [m for m in compiled + model_objs if not m.endswith(".a")]
            _run([*ar, "rcsD", str(tmp), *members], f"archiving {out}", cwd=work)
            os.chmod(tmp, 0o644)
        else:
            cmd = [*ccmd, *tool.link_flags, "-o", str(tmp), *compiled, *model_objs]
            if kind == "shared":
                cmd[1:1] = ["-shared", f"-Wl,-soname,{out.name}", "-Wl,-z,defs"]
            cmd += archives
            _run(cmd + list(tool.libs), f"linking {out}", cwd=work)
            os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()


_RUNTIME_OBJECTS: dict[tuple, bytes] = {}


def _runtime_object(ccmd: list[str], base: list[str], runtime: str, src: Path, obj: Path, what: str) -> None:
    """Write to `obj` runtime source `src` compiled with `ccmd` and `base` flags; compiled
    once per process for each (compiler, flags, `runtime` = runtime_hash()): models
    compiled one after another (tests, `cuvil.compile` in a loop) reuse it. The object is
    the one a fresh compile gives (-ffile-prefix-map keeps paths out of it)."""
    key = (tuple(ccmd), tuple(base), src.name, runtime)
    if key in _RUNTIME_OBJECTS:
        obj.write_bytes(_RUNTIME_OBJECTS[key])
        return
    _run([*ccmd, *base, f"-ffile-prefix-map={obj.parent}=.", "-I", str(RUNTIME_DIR), "-c", str(src), "-o", obj.name],
         what, cwd=obj.parent)
    _RUNTIME_OBJECTS[key] = obj.read_bytes()


QEMU = {"aarch64": ("qemu-aarch64", "/usr/aarch64-linux-gnu", "qemu-user")}


def run_command(artifact: str | os.PathLike) -> list[str]:
    """The command that runs a built executable on this machine: itself when it is this
    machine's code, under qemu-user for aarch64 (with the cross C library as -L), or
    under Node's WASI (`wasi_run.mjs`) for a wasm32-wasi module."""
    import platform

    from .runtime import WASI_RUNNER
    path = Path(artifact)
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as e:
        raise CuvilError(f"cannot run {path}: {e.strerror}") from None
    arch = abi.object_arch(head)
    if arch == "wasm32":
        node = shutil.which("node") or shutil.which("nodejs")
        if node is None:
            raise CuvilError(f"{path} is a wasm32-wasi module: running it needs Node.js 20 or newer (node:wasi)")
        return [node, "--no-warnings", str(WASI_RUNNER), str(path)]
    if arch is None:
        raise CuvilError(f"{path} is not an ELF executable or a wasm module")
    if arch != platform.machine() and arch in QEMU:
        qemu, sysroot, package = QEMU[arch]
        if shutil.which(qemu) is None:
            raise CuvilError(f"{path} is {arch} code: running it here needs {qemu} (Debian {package})")
        return [qemu, "-L", sysroot, str(path.resolve())]
    return [str(path.resolve())]


def write_header(manifest: dict, path: str | os.PathLike) -> Path:
    """Write `<prefix>.h` for `manifest` to `path` atomically."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(render_header(manifest))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


__all__ = ["KINDS", "Toolchain", "toolchain_for", "check_image_support", "check_signatures", "link_artifact",
           "run_command", "runtime_hash", "write_header"]
