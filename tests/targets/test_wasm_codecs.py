"""cuvil.wasm_codecs: the wasm32-wasi libjpeg-turbo/libpng/zlib build that `make setup`
runs (the executables that use it: test_images.py)."""
from __future__ import annotations

import json
import shutil

import pytest

from cuvil import wasm_codecs


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="not a Debian system")
def test_fallback_versions_newest_first_in_dpkg_order():
    versions = {"1.6.39-2", "1.6.39-2+deb12u5", "1.6.39-2+deb12u10", "1.6.39-2.1", "1:1.6.39-1"}
    # epoch first; then Debian revisions compared as dpkg does (10 > 5, "." after "+")
    assert wasm_codecs._newest_first(versions) == [
        "1:1.6.39-1", "1.6.39-2.1", "1.6.39-2+deb12u10", "1.6.39-2+deb12u5", "1.6.39-2"]
    assert wasm_codecs._upstream("1:1.2.13.dfsg-1+deb12u1") == "1.2.13.dfsg"


def test_codec_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CUVIL_WASM32_CODECS", str(tmp_path / "c"))
    assert wasm_codecs.codec_dir() == tmp_path / "c"
    assert not wasm_codecs.installed() and not wasm_codecs.up_to_date()
    assert wasm_codecs.main(["--check"]) == 1
    monkeypatch.delenv("CUVIL_WASM32_CODECS")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert wasm_codecs.codec_dir() == tmp_path / "cache" / "cuvil" / "wasm32-wasi-codecs"


@pytest.mark.skipif(not wasm_codecs.installed(), reason="wasm32 codecs not built (make setup)")
def test_setup_built_the_host_versions_for_wasm32():
    """After `make setup` the cache is current: built from the host's -dev packages'
    source versions (or the same upstream version) by this builder and this clang."""
    d = wasm_codecs.codec_dir()
    stamp = json.loads((d / "KEY").read_text())
    host = wasm_codecs.host_versions()
    assert stamp["host"] == host and stamp["key"] == wasm_codecs.key(host)
    assert all(wasm_codecs._upstream(stamp["built"][s]) == wasm_codecs._upstream(v) for s, v in host.items())
    assert wasm_codecs.main(["--check"]) == 0
    for archive in wasm_codecs.ARCHIVES:  # wasm object archives ("!<arch>" of "\0asm" members)
        data = (d / "lib" / archive).read_bytes()
        assert data.startswith(b"!<arch>\n") and b"\0asm\x01\0\0\0" in data, archive
    for header in ("jpeglib.h", "jconfig.h", "png.h", "pnglibconf.h", "zlib.h"):
        assert (d / "include" / header).is_file(), header
