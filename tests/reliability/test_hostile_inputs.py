"""Hostile and careless inputs to the compiler (issue 33): each is refused with exit 1 and
one line on stderr that names the file (and the line, for a config), in bounded time and
memory; none is accepted silently.

Configs: Python tags, an alias bomb, deep nesting, duplicate keys, a file over 1 MiB, a
FIFO, a huge value in a schema error; model sources that exit, interrupt or are not Python.
Bundles: overlapping, gapped or trailing data, a shape of 10.5, an unused weight, an empty
IR, IR nesting 5,000 deep. Reads: /dev/zero and a FIFO given to `inspect` and `compile`.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import cuvil.ir as cir
from cuvil.cli import main
from cuvil.config import load_config
from cuvil.ir import Function, Module, TensorType
from cuvil.ir.builder import Builder
from cuvil.yaml_load import ConfigError

BASE = textwrap.dedent("""\
    model:
      framework: pytorch
      source: net.py
      entry: make
    inputs:
      - name: x
        shape: [1, 4]
    """)  # 7 lines: what a test appends starts at line 8

NET = "import torch\n\ndef make():\n    return torch.nn.Linear(4, 2).eval()\n"


def run_cli(capsys, *argv) -> tuple[int, str]:
    """(exit code, stderr) of `cuvil ARGV` run in this process; stdout must stay empty."""
    start = time.monotonic()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert time.monotonic() - start < 30, "took too long"
    return rc, err


def assert_one_line(rc: int, err: str, pattern: str) -> None:
    import re
    assert rc == 1, err
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err[:2000]!r}"
    assert len(err) < 500, f"a {len(err)}-character message"
    assert err.startswith("cuvil: error: "), err
    assert re.search(pattern, err), err


def config(tmp_path, extra: str = "", base: str = BASE, name: str = "config.yaml"):
    (tmp_path / "net.py").write_text(NET)
    path = tmp_path / name
    path.write_text(base + extra)
    return path


def build(capsys, tmp_path, cfg) -> tuple[int, str]:
    return run_cli(capsys, "build", "--config", cfg, "--output", tmp_path / "out" / "net",
                   "--cache-dir", tmp_path / "cache")


# -- configs -------------------------------------------------------------------------------------
def alias_bomb(levels: int) -> str:
    """9 ** levels strings from `levels` lines, inside a known key."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "optimize:\n  threads: {" + ", ".join(lines) + "}\n"


HOSTILE_CONFIGS = {
    "python tag": ("optimize:\n  threads: !!python/object/apply:os.system ['echo hi']\n",
                   r"config.yaml:9: the tag .*python/object.* is not allowed"),
    "python name tag": ("model2: !!python/name:os.system\n", r"config.yaml:8: the tag .* is not allowed"),
    "custom tag": ("optimize: !custom {threads: 2}\n", r"config.yaml:8: the tag '!custom' is not allowed"),
    "alias bomb 9 levels": (alias_bomb(9), r"config.yaml:9: YAML aliases expand this value to more than"),
    "recursive alias": ("optimize: &o\n  threads: *o\n", r"config.yaml:8: a YAML alias refers to a value that contains it"),
    "100 levels deep": ("optimize: " + "[" * 100 + "]" * 100 + "\n",
                        r"config.yaml:8: nested more than 64 levels deep"),
    "10,000 levels deep": ("optimize: " + "[" * 10000 + "]" * 10000 + "\n", r"config.yaml:8: "),
    "duplicate top-level key": ("optimize:\n  threads: 2\noptimize:\n  threads: 3\n",
                                r"config.yaml:10: duplicate key 'optimize' \(first at line 8\)"),
    "duplicate nested key": ("optimize:\n  threads: 2\n  threads: 3\n",
                             r"config.yaml:10: duplicate key 'threads' \(first at line 9\)"),
    "huge value in a schema error": ("optimize:\n  threads: " + json.dumps(list(range(100_000))) + "\n",
                                     r"config.yaml:9: optimize.threads: <list of 100000 items> is not of type"),
    "long string in a schema error": ("optimize:\n  threads: " + "x" * 500 + "\n",
                                      r"config.yaml:9: optimize.threads: 'xxxx.*\.\.\. is not of type"),
    "long unknown key": ("optimize:\n  " + "k" * 1000 + ": 1\n", r"config.yaml:9: optimize.'kkk+\.\.\.: unknown key"),
    "over 1 MiB": ("#" + "x" * (1 << 20) + "\n", r"config.yaml: the config file has \d+ bytes, more than the limit"),
    "not UTF-8": ("name: \xff\n", r"config.yaml:8: not UTF-8 text"),
}


@pytest.mark.parametrize("extra,pattern", HOSTILE_CONFIGS.values(), ids=HOSTILE_CONFIGS.keys())
def test_hostile_config_is_one_line(capsys, tmp_path, extra, pattern):
    cfg = config(tmp_path)
    data = (BASE + extra).encode("latin-1" if "\xff" in extra else "utf-8")
    cfg.write_bytes(data)
    rc, err = build(capsys, tmp_path, cfg)
    assert_one_line(rc, err, pattern)
    assert not (tmp_path / "out").exists()


def test_alias_bomb_is_refused_quickly(tmp_path):
    """12 levels would be 9**12 (282 billion) strings: refused before any is built."""
    cfg = config(tmp_path, alias_bomb(12))
    start = time.monotonic()
    with pytest.raises(ConfigError, match="YAML aliases expand"):
        load_config(cfg)
    assert time.monotonic() - start < 5


def test_small_aliases_still_work(tmp_path):
    """Aliases within the budget and merge keys are plain YAML and still load."""
    cfg = config(tmp_path, "optimize: &o {threads: 2}\noverrides:\n  - when: {target: wasm32-wasi}\n"
                           "    optimize: *o\n")
    assert load_config(cfg).data["optimize"] == {"threads": 2}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_config_fifo_is_refused_without_blocking(capsys, tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    rc, err = build(capsys, tmp_path, fifo)
    assert_one_line(rc, err, r"config.yaml: the config file is not a regular file")


MODEL_SOURCES = {
    "sys.exit(3)": ("import sys\nsys.exit(3)\n", "source: net.py",
                    r"config.yaml:3: model.source: importing the model failed: SystemExit: 3 \(at .*net.py:2\)"),
    "KeyboardInterrupt": ("raise KeyboardInterrupt\n", "source: net.py",
                          r"config.yaml:3: model.source: importing the model failed: KeyboardInterrupt \(at .*net.py:1\)"),
    "exception": ("x = 1 / 0\n", "source: net.py",
                  r"config.yaml:3: model.source: importing the model failed: ZeroDivisionError: .*net.py:1"),
    "entry exits": ("import sys\n\ndef make():\n    sys.exit('bye')\n", "source: net.py",
                    r"config.yaml:4: model.entry: calling the entry failed: SystemExit: bye \(at .*net.py:4\)"),
    "not a Python file": (NET, "source: ../../../../../../../../etc/passwd",
                          r"config.yaml:3: model.source: /etc/passwd: not a Python source file"),
}


@pytest.mark.parametrize("code,source,pattern", MODEL_SOURCES.values(), ids=MODEL_SOURCES.keys())
def test_model_source_failure_is_one_line(capsys, tmp_path, code, source, pattern):
    if "passwd" in source and not os.path.isfile("/etc/passwd"):
        pytest.skip("needs /etc/passwd")
    cfg = config(tmp_path, base=BASE.replace("source: net.py", source))
    (tmp_path / "net.py").write_text(code)
    rc, err = build(capsys, tmp_path, cfg)
    assert_one_line(rc, err, pattern)


def test_labels_file_not_utf8_is_one_line(capsys, tmp_path):
    cfg = config(tmp_path, "outputs:\n  - name: y\n    postprocess: {kind: classification, labels: labels.txt}\n")
    (tmp_path / "labels.txt").write_bytes(b"\xff\xfe cat\n")
    rc, err = build(capsys, tmp_path, cfg)
    assert_one_line(rc, err, r"config.yaml:10: outputs\[0\].postprocess.labels: the labels file is not UTF-8 text")


# -- bundles -------------------------------------------------------------------------------------
def good_bundle(tmp_path) -> bytes:
    module = Module()
    fn = Function("main", ["x"], [TensorType((2, 3))], ["y"])
    b = Builder(fn.body)
    w = b.constant(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    c = b.constant(np.arange(3, dtype=np.float32), "c")
    b.op_multi("cuvil.return", b.op("cuvil.add", b.op("cuvil.add", fn.args[0], w), c))
    module.add(fn)
    cir.verify(module)
    cir.write_bundle(module, tmp_path / "good.cvir")
    return (tmp_path / "good.cvir").read_bytes()


def split(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(header: dict, body: bytes) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + body


def edited(fn):
    def make(tmp_path):
        header, body = split(good_bundle(tmp_path))
        body = fn(header, body)
        return join(header, body)
    return make


# The data: c (12 bytes) at 0, then w (24 bytes) at 12.
def _overlap(h, body):
    h["w"]["data_offsets"] = [0, 24]  # w over c and half of itself
    return body[:24]


def _gap(h, body):
    h["w"]["data_offsets"] = [16, 40]
    return body + b"\0" * 4


def _empty_ir(h, body):
    for name in ("c", "w"):
        del h[name]
    h["__metadata__"]["ir"] = ""
    return b""


def _unused(h, body):
    h["extra"] = {"dtype": "F32", "shape": [1], "data_offsets": [len(body), len(body) + 4]}
    return body + b"\0" * 4


def _ir(text):
    def fn(h, body):
        h["__metadata__"]["ir"] = text
        return body
    return fn


HOSTILE_BUNDLES = {
    "tensors overlap": (edited(_overlap), r"tensor 'w' overlaps the tensor before it"),
    "a gap between tensors": (edited(_gap), r"tensor 'w' leaves a gap at byte 12"),
    "data past the last tensor": (edited(lambda h, body: body + b"\0" * 8), r"8 bytes of data past the last tensor"),
    "shape [10.5]": (edited(lambda h, body: h["c"].__setitem__("shape", [1.5, 2]) or body),
                     r"bad header entry for 'c' .*a list of integers"),
    "shape of booleans": (edited(lambda h, body: h["c"].__setitem__("shape", [True, 3]) or body),
                          r"bad header entry for 'c'"),
    "an unused weight": (edited(_unused), r"tensor 'extra' is not used by the IR"),
    "empty IR": (edited(_empty_ir), r"the IR has no 'main' function"),
    "IR nested 5,000 deep": (
        edited(lambda h, body: _ir(
            h["__metadata__"]["ir"].replace("{name = \"w\"}", "{name = \"w\", deep = " + "[" * 5000 + "]" * 5000 + "}"))
            (h, body)),
        r"IR line \d+: attributes nested more than 64 levels deep"),
}


@pytest.mark.parametrize("make,pattern", HOSTILE_BUNDLES.values(), ids=HOSTILE_BUNDLES.keys())
def test_hostile_bundle_is_one_line(capsys, tmp_path, make, pattern):
    path = tmp_path / "bad.cvir"
    path.write_bytes(make(tmp_path))
    rc, err = run_cli(capsys, "inspect", "--summary", path)
    assert_one_line(rc, err, rf"bad.cvir: .*(?:{pattern})")


def test_good_bundle_still_reads(capsys, tmp_path):
    """The edits above break a bundle that is otherwise read: each test can fail."""
    path = tmp_path / "ok.cvir"
    path.write_bytes(join(*split(good_bundle(tmp_path))))
    assert run_cli(capsys, "inspect", "--summary", path)[0] == 0


# -- unbounded reads -----------------------------------------------------------------------------
SPECIAL = [p for p in ("/dev/zero", "/dev/urandom") if os.path.exists(p)]


@pytest.mark.parametrize("path", SPECIAL)
@pytest.mark.parametrize("command", ["inspect", "inspect-cvir", "compile"])
def test_special_files_are_refused(capsys, tmp_path, command, path):
    target = path
    if command == "inspect-cvir":  # a .cvir name that is a device
        target = tmp_path / "dev.cvir"
        target.symlink_to(path)
    if command == "compile":
        argv = ["compile", target, "--config", config(tmp_path), "--output-dir", tmp_path / "c"]
    else:
        argv = ["inspect", target]
    rc, err = run_cli(capsys, *argv)
    assert_one_line(rc, err, r"is not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("name", ["pipe", "pipe.cvir", "pipe.json"])
def test_inspect_of_a_fifo_does_not_block(capsys, tmp_path, name):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    done = []
    t = threading.Thread(target=lambda: done.append(run_cli(capsys, "inspect", fifo)), daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():  # unblock the reader so the test process can end
        with open(fifo, "wb"):
            pass
        pytest.fail("inspect blocked on a FIFO")
    rc, err = done[0]
    assert_one_line(rc, err, r"is not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_link_of_a_fifo_manifest_does_not_block(capsys, tmp_path):
    (tmp_path / "compiled").mkdir()
    os.mkfifo(tmp_path / "compiled" / "net.json")
    rc, err = run_cli(capsys, "link", tmp_path / "compiled", "--output", tmp_path / "net")
    assert_one_line(rc, err, r"net.json: the manifest is not a regular file")


def test_python_api_reads_no_device(tmp_path):
    from cuvil.errors import ParseError
    if not SPECIAL:
        pytest.skip("no /dev/zero")
    with pytest.raises(ParseError, match="is not a regular file"):
        cir.read_bundle(SPECIAL[0])


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="special files and FIFOs of Linux")
