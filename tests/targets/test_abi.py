"""ABI signatures: the manifest and the model object record target triple, Cuvil ABI and
runtime version; the link stage refuses a model, runtime or plugin of another target or
ABI version naming both sides; the runtime checks again when it starts; `cuvil inspect`
prints them."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from cuvil.build import build, compile_bundle, compile_options, link_compiled
from cuvil.cli import main
from cuvil.config import load_config
from cuvil.errors import LinkError
from cuvil.glue import render_glue
from cuvil.options import TargetSpec
from cuvil.runtime import CORE_SOURCES, EXE_SOURCES, RUNTIME_DIR, abi

from .helpers import available, run, tiny_project

PLUGIN_C = '''\
#include "cuvil_plugin.h"
CUVIL_PLUGIN(noop);
'''


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The tiny model captured once and compiled for the host."""
    d = tmp_path_factory.mktemp("abi")
    cfg = load_config(tiny_project(d / "p"))
    build(cfg, d / "tiny", cache_dir=d / "cache", log=lambda s: None)
    cvir = next((d / "cache").glob("capture/*/model.cvir"))
    compile_bundle(cvir, compile_options(cfg), d / "host")
    return {"dir": d, "cfg": cfg, "cvir": cvir, "host": d / "host"}


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _patch_abi(obj, version: int) -> None:
    data = obj.read_bytes()
    old = f";abi={abi.ABI_VERSION};".encode()
    assert data.count(old) == 1
    obj.write_bytes(data.replace(old, f";abi={version};".encode()))


def test_manifest_and_object_record_the_signature(compiled):
    manifest = json.loads((compiled["host"] / "tiny.json").read_text())
    assert manifest["signature"] == {"triple": "x86_64-unknown-linux-gnu", "abi_version": abi.ABI_VERSION,
                                     "runtime_version": abi.RUNTIME_VERSION,
                                     "plugin_abi_version": abi.PLUGIN_ABI_VERSION}
    (sig,) = abi.find_signatures((compiled["host"] / "tiny.o").read_bytes())
    assert sig == {"kind": "model", "name": "tiny", "abi": str(abi.ABI_VERSION), "runtime": abi.RUNTIME_VERSION,
                   "triple": "x86_64-unknown-linux-gnu"}
    nm = subprocess.run(["nm", str(compiled["host"] / "tiny.o")], capture_output=True, text=True).stdout
    assert re.search(r" R tiny_signature$", nm, re.M)


def test_versions_agree_between_python_and_c_headers():
    text = (RUNTIME_DIR / "cuvil_runtime.h").read_text()
    assert f"#define CUVIL_ABI_VERSION {abi.ABI_VERSION}\n" in text
    assert f'#define CUVIL_RUNTIME_VERSION "{abi.RUNTIME_VERSION}"' in text
    assert f"#define CUVIL_PLUGIN_ABI_VERSION {abi.PLUGIN_ABI_VERSION}\n" in (RUNTIME_DIR / "cuvil_plugin.h").read_text()


def test_inspect_prints_signatures_of_dir_manifest_and_artifact(compiled, capsys):
    assert main(["inspect", str(compiled["host"])]) == 0
    out = capsys.readouterr().out
    assert f"model tiny for x86_64-unknown-linux-gnu (Cuvil ABI {abi.ABI_VERSION}, runtime {abi.RUNTIME_VERSION}" \
           in out
    assert f"tiny.o (x86_64): 1 signature(s)" in out
    assert main(["inspect", str(compiled["host"] / "tiny.json")]) == 0
    assert "model tiny for x86_64-unknown-linux-gnu" in capsys.readouterr().out
    assert main(["inspect", str(compiled["dir"] / "tiny")]) == 0
    out = capsys.readouterr().out
    assert "model tiny for x86_64" in out and "runtime cuvil for x86_64-unknown-linux-gnu" in out


def test_model_of_another_abi_version_is_refused_at_link_naming_both_sides(compiled, tmp_path):
    d = _copy(compiled["host"], tmp_path / "c")
    _patch_abi(d / "tiny.o", 99)
    with pytest.raises(LinkError) as e:
        link_compiled(d, "executable", tmp_path / "tiny")
    msg = str(e.value)
    assert "model 'tiny' (tiny_0_tiny.o) for x86_64-unknown-linux-gnu (Cuvil ABI 99" in msg
    assert f"Cuvil runtime compiled by 'cc' for x86_64-unknown-linux-gnu (Cuvil ABI {abi.ABI_VERSION}" in msg
    assert not (tmp_path / "tiny").exists()


@pytest.mark.skipif(not available("aarch64-linux-gnu"), reason="aarch64 toolchain missing")
def test_model_for_another_target_with_this_runtime_is_refused(compiled, tmp_path):
    opts = compile_options(compiled["cfg"])
    opts = opts.replace(target=TargetSpec("aarch64-linux-gnu"))
    compile_bundle(compiled["cvir"], opts, tmp_path / "arm")
    with pytest.raises(LinkError) as e:
        link_compiled(tmp_path / "arm", "executable", tmp_path / "tiny", cc="cc")  # the host compiler
    msg = str(e.value)
    assert "model 'tiny' (tiny_0_tiny.o) for aarch64-unknown-linux-gnu" in msg
    assert "runtime compiled by 'cc' for x86_64-unknown-linux-gnu" in msg


def test_runtime_refuses_a_model_of_another_abi_linked_by_hand(compiled, tmp_path):
    """Linked without the link stage's check (as a hand-written build would): the
    runtime's own check stops it when the context is created."""
    d = _copy(compiled["host"], tmp_path / "c")
    _patch_abi(d / "tiny.o", 7)
    manifest = json.loads((d / "tiny.json").read_text())
    (d / "glue.c").write_text(render_glue(manifest, "tiny.h", app=True))
    sources = [str(RUNTIME_DIR / s) for s in CORE_SOURCES + EXE_SOURCES] + [str(d / "glue.c")]
    subprocess.run(["cc", "-std=c99", "-O1", "-DCUVIL_NO_CODECS", "-I", str(d), "-I", str(RUNTIME_DIR), *sources,
                    str(d / "tiny.o"), str(d / "tiny.weights.o"), "-o", str(d / "tiny"), "-lm", "-lpthread"],
                   check=True)
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    proc = run(d / "tiny", "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", check=False)
    assert proc.returncode == 1
    assert "model tiny was built for x86_64-unknown-linux-gnu (Cuvil ABI 7" in proc.stderr
    assert f"this runtime is for x86_64-unknown-linux-gnu (Cuvil ABI {abi.ABI_VERSION}" in proc.stderr


@pytest.mark.skipif(not available("aarch64-linux-gnu"), reason="aarch64 toolchain missing")
def test_plugin_built_for_another_target_is_refused(compiled, tmp_path):
    (tmp_path / "noop.c").write_text(PLUGIN_C)
    subprocess.run(["aarch64-linux-gnu-gcc", "-c", "-I", str(RUNTIME_DIR), str(tmp_path / "noop.c"), "-o",
                    str(tmp_path / "noop.o")], check=True)
    with pytest.raises(LinkError) as e:
        link_compiled(compiled["host"], "executable", tmp_path / "tiny", plugins=(tmp_path / "noop.o",))
    msg = str(e.value)
    assert "refusing plugin 'noop' (plugin0_noop.o) for aarch64-unknown-linux-gnu" in msg
    assert "model 'tiny' and the Cuvil runtime compiled by 'cc' for x86_64-unknown-linux-gnu" in msg


def test_plugin_built_against_another_plugin_abi_is_refused(compiled, tmp_path):
    """A plugin that ships its own (older) copy of cuvil_plugin.h: the quoted include
    finds that copy first, so the module really is built for the other ABI."""
    header = (RUNTIME_DIR / "cuvil_plugin.h").read_text()
    (tmp_path / "cuvil_plugin.h").write_text(header.replace(
        f"#define CUVIL_PLUGIN_ABI_VERSION {abi.PLUGIN_ABI_VERSION}\n", "#define CUVIL_PLUGIN_ABI_VERSION 0\n"))
    (tmp_path / "noop.c").write_text(PLUGIN_C)
    with pytest.raises(LinkError) as e:
        link_compiled(compiled["host"], "executable", tmp_path / "tiny", plugins=(tmp_path / "noop.c",))
    msg = str(e.value)
    assert "plugin 'noop' (plugin0_noop.o) for x86_64-unknown-linux-gnu" in msg and "plugin ABI 0" in msg
    assert f"plugin ABI {abi.PLUGIN_ABI_VERSION}" in msg


def test_runtime_refuses_a_plugin_descriptor_of_another_abi(compiled, tmp_path):
    """The descriptor's abi_version is checked before any hook is called."""
    (tmp_path / "noop.c").write_text('#include "cuvil_plugin.h"\nCUVIL_PLUGIN(noop, .abi_version = 5);\n')
    exe = link_compiled(compiled["host"], "executable", tmp_path / "tiny", plugins=(tmp_path / "noop.c",))
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    proc = run(exe, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", check=False)
    assert proc.returncode == 1 and "plugin 'noop' was built for Cuvil plugin ABI 5" in proc.stderr
    assert f"speaks plugin ABI {abi.PLUGIN_ABI_VERSION}" in proc.stderr


def test_plugin_module_without_a_descriptor_is_refused(compiled, tmp_path):
    (tmp_path / "bare.c").write_text("int helper(int x) { return x + 1; }\n")
    with pytest.raises(LinkError, match=r"plugin module plugin0_bare.o has no Cuvil plugin signature: .*CUVIL_PLUGIN"):
        link_compiled(compiled["host"], "executable", tmp_path / "tiny", plugins=(tmp_path / "bare.c",))
