"""JPEG and PNG decoding for wasm32-wasi executables: libjpeg-turbo, libpng and zlib
from Debian's source packages, compiled with clang for wasm32-wasi into a cache.

Debian packages these libraries for x86_64 and arm64 but not for wasm32, so the set-up
(`make setup`) builds them: the same source versions as the host's -dev packages
(libjpeg62-turbo-dev, libpng-dev, zlib1g-dev) with Debian's patches applied, so an
image decodes to the same pixels on every target. libjpeg-turbo is built with its
CMake build and without SIMD (its C code gives the same pixels as its SIMD code for
the default integer IDCT); libpng (with the prebuilt pnglibconf.h) and zlib are
compiled file by file. libpng calls setjmp, which wasi-libc lacks: it is compiled with
clang's WebAssembly setjmp/longjmp lowering (runtime/wasm32/setjmp.h,
runtime/cuvil_wasm_sjlj.c), so executables that decode images use the WebAssembly
exception-handling proposal (Node 16+ and current browsers run it).

    python -m cuvil.wasm_codecs           build unless the cache is up to date
    python -m cuvil.wasm_codecs --check   exit 0 when up to date, 1 otherwise
    python -m cuvil.wasm_codecs --print   print the directory

The directory is $CUVIL_WASM32_CODECS, else $XDG_CACHE_HOME/cuvil/wasm32-wasi-codecs
(~/.cache/...): include/ (jpeglib.h, png.h, zlib.h, ...), lib/ (libjpeg.a, libpng16.a,
libz.a) and KEY, which names the source versions, the compiler and this builder; a
change of any rebuilds it. Sources come from `apt-get source` (deb-src entries, cmake
and dpkg-dev needed: tools/setup_codecs.sh, run by `make setup`, adds them): the host's
exact version, else the newest of the same upstream version that the archive serves
(the build says so). About 30 s on two cores.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import CuvilError
from .runtime import RUNTIME_DIR

# source package -> the host's -dev package whose version it must match
SOURCES = {"libjpeg-turbo": "libjpeg62-turbo-dev", "libpng1.6": "libpng-dev", "zlib": "zlib1g-dev"}
ARCHIVES = ("libjpeg.a", "libpng16.a", "libz.a")
ZLIB_FILES = ("adler32", "compress", "crc32", "deflate", "infback", "inffast", "inflate", "inftrees", "trees",
              "uncompr", "zutil")
PNG_FILES = ("png", "pngerror", "pngget", "pngmem", "pngpread", "pngread", "pngrio", "pngrtran", "pngrutil",
             "pngset", "pngtrans", "pngwio", "pngwrite", "pngwtran", "pngwutil")
SJLJ_FLAGS = ("-mexception-handling", "-mllvm", "-wasm-enable-sjlj")
SETJMP_DIR = RUNTIME_DIR / "wasm32"


def codec_dir() -> Path:
    """Where the wasm32 codecs are (or will be) installed."""
    if os.environ.get("CUVIL_WASM32_CODECS"):
        return Path(os.environ["CUVIL_WASM32_CODECS"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "cuvil" / "wasm32-wasi-codecs"


def installed() -> bool:
    """The archives are there (whatever their KEY)."""
    return all((codec_dir() / "lib" / a).is_file() for a in ARCHIVES)


def _out(cmd: list[str], cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    except OSError as e:
        raise CuvilError(f"wasm32 codecs: cannot run {cmd[0]!r}: {e.strerror}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-20:]
        raise CuvilError(f"wasm32 codecs: {' '.join(cmd[:4])} ... failed (exit {proc.returncode}):\n" + "\n".join(tail))
    return proc.stdout


def clang() -> str:
    return "clang" if shutil.which("clang") or not shutil.which("clang-14") else "clang-14"


def _tool(name: str) -> str:
    return name if shutil.which(name) else f"{name}-14"


def host_versions() -> dict[str, str]:
    """Source package -> the source version of the host's -dev package."""
    found = {}
    arch = _out(["dpkg", "--print-architecture"]).strip() if shutil.which("dpkg") else ""
    for src, dev in SOURCES.items():
        try:
            found[src] = _out(["dpkg-query", "-W", "-f", "${source:Version}", f"{dev}:{arch}" if arch else dev]).strip()
        except CuvilError:
            raise CuvilError(f"wasm32 codecs: {dev} is not installed (Debian); install it first (make setup)") from None
    return found


def key(versions: dict[str, str]) -> str:
    """What the cached build depends on: versions, compiler, this builder, setjmp.h."""
    h = hashlib.sha256(json.dumps(versions, sort_keys=True).encode())
    h.update(_out([clang(), "--version"]).splitlines()[0].encode())
    for path in (Path(__file__), SETJMP_DIR / "setjmp.h"):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def up_to_date() -> bool:
    stamp = codec_dir() / "KEY"
    try:
        return installed() and json.loads(stamp.read_text())["key"] == key(host_versions())
    except (OSError, ValueError, KeyError, CuvilError):
        return False


def _upstream(version: str) -> str:
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


def _newest_first(versions: set[str]) -> list[str]:
    """Debian versions, newest first (dpkg's ordering)."""
    def cmp(a: str, b: str) -> int:
        if a == b:
            return 0
        return -1 if subprocess.run(["dpkg", "--compare-versions", a, "gt", b], check=False).returncode == 0 else 1
    return sorted(versions, key=functools.cmp_to_key(cmp))


def fetch(src: str, want: str, into: Path) -> tuple[str, Path]:
    """`apt-get source` the version `want` of `src`, else the newest served version of the
    same upstream version (the security archive's sources are not always reachable);
    (the version, the unpacked directory)."""
    try:
        shown = _out(["apt-cache", "showsrc", src])
    except CuvilError as e:
        raise CuvilError(f"{e}\n(no deb-src entries? tools/setup_codecs.sh, run by make setup, adds them)") from None
    listed = [line.split(":", 1)[1].strip() for line in shown.splitlines() if line.startswith("Version:")]
    if not listed:
        raise CuvilError(f"wasm32 codecs: apt knows no source package {src} (no deb-src entries? "
                         "tools/setup_codecs.sh, run by make setup, adds them)")
    same = _newest_first({v for v in listed if _upstream(v) == _upstream(want) and v != want})
    errors = []
    for version in [want, *same]:
        proc = subprocess.run(["apt-get", "source", "-qq", f"{src}={version}"], cwd=into, capture_output=True,
                              text=True, check=False)
        unpacked = [p for p in into.iterdir() if p.is_dir() and p.name.startswith(f"{src}-")]
        if proc.returncode == 0 and unpacked:
            return version, unpacked[0]
        errors.append(f"{version}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        for p in into.iterdir():
            if p.name.startswith(src):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    hint = " (no deb-src entries? tools/setup_codecs.sh adds them)" if "deb-src" in " ".join(errors) else ""
    raise CuvilError(f"wasm32 codecs: cannot download the source of {src}{hint}: " + "; ".join(errors))


def build_jpeg(src: Path, work: Path, lib: Path, include: Path) -> None:
    """libjpeg-turbo's own CMake build, static library only, no SIMD, no TurboJPEG."""
    build = work / "build-jpeg"
    build.mkdir()
    _out(["cmake", "-G", "Unix Makefiles", str(src), "-DCMAKE_SYSTEM_NAME=Generic",
          "-DCMAKE_SYSTEM_PROCESSOR=wasm32", f"-DCMAKE_C_COMPILER={shutil.which(clang())}",
          "-DCMAKE_C_COMPILER_TARGET=wasm32-wasi", f"-DCMAKE_AR={shutil.which(_tool('llvm-ar'))}",
          f"-DCMAKE_RANLIB={shutil.which(_tool('llvm-ranlib'))}", "-DCMAKE_BUILD_TYPE=Release",
          "-DCMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY", "-DWITH_SIMD=0", "-DENABLE_SHARED=0",
          "-DENABLE_STATIC=1", "-DWITH_TURBOJPEG=0", "-DWITH_JAVA=0"], cwd=build)
    _out(["cmake", "--build", ".", "--target", "jpeg-static", "--", f"-j{os.cpu_count() or 1}"], cwd=build)
    shutil.copyfile(build / "libjpeg.a", lib / "libjpeg.a")
    for name in ("jpeglib.h", "jmorecfg.h", "jerror.h"):
        shutil.copyfile(src / name, include / name)
    shutil.copyfile(build / "jconfig.h", include / "jconfig.h")


def _archive(objects_of: Path, files: tuple[str, ...], src: Path, flags: list[str], out: Path) -> None:
    objects_of.mkdir()
    for name in files:
        _out([clang(), "--target=wasm32-wasi", "-O2", *flags, "-c", str(src / f"{name}.c"), "-o", f"{name}.o"],
             cwd=objects_of)
    _out([_tool("llvm-ar"), "rcsD", str(out), *(f"{n}.o" for n in files)], cwd=objects_of)


def build_zlib_png(zsrc: Path, psrc: Path, work: Path, lib: Path, include: Path) -> None:
    _archive(work / "build-zlib", ZLIB_FILES, zsrc, [], lib / "libz.a")
    for name in ("zlib.h", "zconf.h"):
        shutil.copyfile(zsrc / name, include / name)
    shutil.copyfile(psrc / "scripts" / "pnglibconf.h.prebuilt", include / "pnglibconf.h")
    flags = [*SJLJ_FLAGS, "-I", str(include), "-I", str(SETJMP_DIR)]
    _archive(work / "build-png", PNG_FILES, psrc, flags, lib / "libpng16.a")
    for name in ("png.h", "pngconf.h"):
        shutil.copyfile(psrc / name, include / name)


def build(log=print) -> Path:
    """Build the codecs into codec_dir() unless up to date; returns the directory."""
    target = codec_dir()
    if up_to_date():
        log(f"wasm32 codecs: up to date in {target}")
        return target
    for tool in (clang(), "cmake", "apt-get", "dpkg-source", _tool("llvm-ar")):
        if shutil.which(tool) is None:
            raise CuvilError(f"wasm32 codecs: {tool!r} not found (Debian: clang lld llvm wasi-libc cmake dpkg-dev)")
    versions = host_versions()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".wasm32-codecs-", dir=target.parent) as tmp:
        work = Path(tmp)
        out = work / "out"
        (out / "lib").mkdir(parents=True)
        (out / "include").mkdir()
        got, dirs = {}, {}
        for src, want in versions.items():
            got[src], dirs[src] = fetch(src, want, work)
            log(f"wasm32 codecs: {src} {got[src]}" + ("" if got[src] == want else f" (the host has {want})"))
        build_jpeg(dirs["libjpeg-turbo"], work, out / "lib", out / "include")
        build_zlib_png(dirs["zlib"], dirs["libpng1.6"], work, out / "lib", out / "include")
        (out / "KEY").write_text(json.dumps({"key": key(versions), "host": versions, "built": got}, indent=1) + "\n")
        old = work / "old"
        if target.exists():
            os.replace(target, old)
        os.replace(out, target)
    log(f"wasm32 codecs: {target}")
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cuvil.wasm_codecs", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 0 when the cache is up to date, 1 otherwise")
    p.add_argument("--print", action="store_true", help="print the directory")
    args = p.parse_args(argv)
    if args.print:
        print(codec_dir())
        return 0
    if args.check:
        return 0 if up_to_date() else 1
    try:
        build()
    except CuvilError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
