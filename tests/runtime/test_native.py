"""The link stage (`cuvil.native.link_artifact`) and the generated header: clean C,
deterministic bytes, atomic outputs, clear errors, and executables that need only the
system's C libraries."""
from __future__ import annotations

import copy
import re
import subprocess

import pytest

from cuvil import native
from cuvil.backend.header import render_header
from cuvil.errors import CuvilError, LinkError
from cuvil.native import link_artifact
from cuvil.runtime import CORE_SOURCES, EXE_SOURCES, RUNTIME_DIR

STRICT = ["cc", "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-fsyntax-only", "-I", str(RUNTIME_DIR)]


def _syntax_check(path, *extra):
    proc = subprocess.run([*STRICT, *extra, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("defines", [[], ["-DCUVIL_NO_CODECS"]])
def test_runtime_sources_are_warning_free_c99(defines):
    for name in CORE_SOURCES + EXE_SOURCES:
        _syntax_check(RUNTIME_DIR / name, *defines)


def test_header_is_deterministic_and_compiles(cnn, tmp_path):
    manifest = copy.deepcopy(cnn.manifest)
    manifest["inputs"][0]["name"] = 'odd */ "name"\n\u00e9?'
    text = render_header(manifest)
    assert text == render_header(copy.deepcopy(manifest))
    assert "#define TINY_CNN_ARENA_SIZE ((size_t)%du)" % manifest["arena_size"] in text
    assert "#ifndef CUVIL_MODEL_TINY_CNN_H" in text and '#include "cuvil_runtime.h"' in text
    (tmp_path / "tiny_cnn.h").write_text(text)
    user = tmp_path / "user.c"
    user.write_text('#include "tiny_cnn.h"\n#include "tiny_cnn.h"\n'
                    'int main(void) { return tiny_cnn_input_count() + TINY_CNN_INPUT_COUNT; }\n')
    _syntax_check(user, "-I", str(tmp_path))
    impl = tmp_path / "impl.c"
    impl.write_text('#define TINY_CNN_IMPLEMENTATION\n#include "tiny_cnn.h"\n'
                    'int main(void) { return tiny_cnn_input_name(0)[0] != \'o\'; }\n')
    _syntax_check(impl, "-I", str(tmp_path))


def _link_all(model, tmp, kinds):
    tmp.mkdir()
    names = {"exe": model.prefix, "shared": f"lib{model.prefix}.so", "static": f"lib{model.prefix}.a"}
    return {k: link_artifact(k, model.objects, model.manifest, model.header, tmp / names[k],
                             workdir=tmp / f"work-{k}").read_bytes() for k in kinds}


def test_artifacts_are_deterministic(cnn, tmp_path):
    """Also: the runtime objects kept for the rest of the process (the second link reuses
    them) give the same bytes as compiling the runtime afresh (the first)."""
    native._RUNTIME_OBJECTS.clear()
    first = _link_all(cnn, tmp_path / "a", ("static", "shared", "exe"))
    kept = dict(native._RUNTIME_OBJECTS)
    assert len(kept) >= len(CORE_SOURCES) + len(EXE_SOURCES)
    second = _link_all(cnn, tmp_path / "b", ("static", "shared", "exe"))
    assert native._RUNTIME_OBJECTS == kept  # nothing compiled again
    for kind in first:
        assert first[kind] == second[kind], kind
        assert str(tmp_path).encode() not in first[kind], f"{kind} contains the build path"


def test_static_archive_members(cnn):
    members = subprocess.run(["ar", "t", str(cnn.artifact("static"))], capture_output=True, text=True,
                             check=True).stdout.split()
    assert members == ["cuvil_runtime.o", "cuvil_threadpool.o", "tiny_cnn_glue.o", "tiny_cnn_0_model.o",
                       "tiny_cnn_1_weights.o"]
    verbose = subprocess.run(["ar", "tv", str(cnn.artifact("static"))], capture_output=True, text=True,
                             check=True).stdout
    assert all(" 0/0 " in line for line in verbose.splitlines())  # `ar D`: no owners, no times


def test_exe_links_only_system_c_libraries(cnn):
    exe = cnn.artifact("exe")
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True, check=True).stdout
    libs = {re.split(r"[\s=]", line.strip())[0].rsplit("/", 1)[-1] for line in ldd.splitlines() if line.strip()}
    allowed = re.compile(r"(linux-vdso|libc|libm|libpthread|ld-linux(-x86-64)?)\.so\.\d+\Z")
    assert libs and all(allowed.match(lib) for lib in libs), libs
    assert not re.search(r"jpeg|png|libz|stdc\+\+|python|torch", ldd)
    nm = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    assert "jpeg_read_header" in nm and "png_read_info" in nm  # the codecs are inside


def test_link_failures_raise_link_error_and_leave_no_file(two, tmp_path):
    out = tmp_path / "libtwo_io.so"
    out.write_bytes(b"previous artifact")
    with pytest.raises(LinkError, match=r"compiling cuvil_runtime\.c .* failed .*\n  false "):
        link_artifact("shared", two.objects, two.manifest, two.header, out, cc="false")
    with pytest.raises(LinkError, match="cannot run"):
        link_artifact("shared", two.objects, two.manifest, two.header, out, cc="/nonexistent/cc")
    with pytest.raises(LinkError, match="does not exist"):
        link_artifact("shared", [tmp_path / "missing.o"], two.manifest, two.header, out)
    with pytest.raises(LinkError, match="unknown artifact kind"):
        link_artifact("dll", two.objects, two.manifest, two.header, out)
    with pytest.raises(LinkError, match=r"linking .*two_io_forward|undefined reference"):
        link_artifact("shared", two.objects[1:], two.manifest, two.header, out)  # no model.o
    assert out.read_bytes() == b"previous artifact"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["libtwo_io.so"]


def _mutated(manifest, edit):
    m = copy.deepcopy(manifest)
    edit(m)
    return m


BAD_MANIFESTS = [
    (lambda m: m.update(prefix="9lives"), "prefix"),
    (lambda m: m.update(format="cuvil-manifest-0"), "format"),
    (lambda m: m.update(arena_size=-1), "arena_size"),
    (lambda m: m["inputs"][0].update(dtype="f128"), r"inputs\[0\]\.dtype"),
    (lambda m: m["inputs"][0].update(shape=[1, "batch", 16, 16]), r"inputs\[0\]\.shape"),
    (lambda m: m["outputs"].append(dict(m["outputs"][0])), r"outputs\[1\]\.name"),
    (lambda m: m["preprocess"]["x"].update(crop=20), r"preprocess\.x\.crop"),
    (lambda m: m["preprocess"]["x"].update(std=[0.2, 0.0, 0.2]), r"preprocess\.x\.std"),
    (lambda m: m["preprocess"]["x"].update(mean=[0.5, 0.5]), r"preprocess\.x\.mean"),
    (lambda m: m["preprocess"]["x"].update(color="CMYK"), r"preprocess\.x\.color"),
    (lambda m: m["preprocess"]["x"].update(flip=True), r"preprocess\.x: unknown key 'flip'"),
    (lambda m: m["preprocess"].update(nope={"kind": "image"}), r"preprocess\.nope: no such tensor"),
    (lambda m: m["postprocess"]["output"].update(labels=["a"]), r"postprocess\.output\.labels: has 1 labels"),
    (lambda m: m["postprocess"]["output"].update(kind="detection"), r"postprocess\.output\.kind"),
]


@pytest.mark.parametrize("edit,key", BAD_MANIFESTS)
def test_bad_manifest_names_the_key(cnn, tmp_path, edit, key):
    manifest = _mutated(cnn.manifest, edit)
    with pytest.raises(CuvilError, match=r"manifest: " + key):
        link_artifact("exe", cnn.objects, manifest, None, tmp_path / "model")
    assert list(tmp_path.iterdir()) == []
