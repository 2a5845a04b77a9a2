"""No leftovers after a kill (issue 33). Every temporary file or directory Cuvil writes is
`.cuvil-PPPPPPPP-RRRRRR.tmp` (writer's process id in hex) in the target's directory:

- a `cuvil build` killed with SIGKILL leaves its temporary directory in the cache; the
  next build removes it (its process is gone) and ends with nothing but complete entries;
- the executable, sent SIGTERM or SIGINT while writing its output, removes its temporary
  file before it dies; killed with SIGKILL it leaves one, which its next run in the same
  directory removes; a live process's temporary file is left alone;
- a 250-character output name (legal) works for `cuvil build` and the executable.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from cuvil.build import build
from cuvil.config import load_config
from cuvil.fsutil import TEMP_RE, clean_stale

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals and process ids")

MODEL = '''
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(64, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))

def make():
    return Net().eval(), (torch.randn(1, 64),)
'''

# A post-processing plugin that writes part of its output, then waits (CUVIL_SLOW_S
# seconds) before the rest: the output's temporary file exists while it waits.
PLUGIN = r'''
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <time.h>
#include "cuvil_plugin.h"

static cuvil_status slow_write(void *state, int n, const cuvil_tensor_desc *outputs, const void *const *data,
                               const cuvil_writer *out) {
    const char *s = getenv("CUVIL_SLOW_S");
    struct timespec ts = {s ? atoi(s) : 0, 0};
    cuvil_status st;
    (void)state; (void)n; (void)outputs;
    if ((st = cuvil_writef(out, "first %g\n", (double)((const float *)data[0])[0])) != CUVIL_OK) return st;
    nanosleep(&ts, NULL);
    return cuvil_writef(out, "done\n");
}
CUVIL_PLUGIN(slow_writer, .postprocess = slow_write);
'''

CONFIG = """\
model: {framework: pytorch, source: net.py, entry: make}
inputs: [{name: x, shape: [1, 64]}]
plugin:
  modules: [slow_writer.c]
  postprocess: {plugin: slow_writer}
"""


def temps(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if TEMP_RE.match(p.name))


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def write_config(d: Path) -> Path:
    (d / "net.py").write_text(MODEL)
    (d / "slow_writer.c").write_text(PLUGIN)
    (d / "config.yaml").write_text(CONFIG)
    return d / "config.yaml"


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    d = tmp_path_factory.mktemp("exe")
    path = build(load_config(write_config(d)), d / "net", cache_dir=d / "cache", log=lambda s: None)
    x = d / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32))
    return path, x


def _start(exe_and_x, out: Path, slow: int) -> subprocess.Popen:
    exe, x = exe_and_x
    return subprocess.Popen([str(exe), "--input", str(x), "--output", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "CUVIL_SLOW_S": str(slow)})


def _wait_for_temp(directory: Path, proc: subprocess.Popen) -> Path:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = temps(directory)
        if found:
            return found[0]
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.01)
    proc.kill()
    pytest.fail("no temporary file appeared")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_executable_removes_its_temp_file_on_a_signal(exe, tmp_path, sig):
    out = tmp_path / "out.txt"
    proc = _start(exe, out, slow=30)
    tmp = _wait_for_temp(tmp_path, proc)
    assert TEMP_RE.match(tmp.name) and int(TEMP_RE.match(tmp.name).group(1), 16) == proc.pid
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == -sig  # it still ends as the signal says
    assert temps(tmp_path) == [] and not out.exists()


def test_executable_leftover_of_sigkill_is_removed_by_the_next_run(exe, tmp_path):
    out = tmp_path / "out.txt"
    proc = _start(exe, out, slow=30)
    tmp = _wait_for_temp(tmp_path, proc)
    proc.kill()
    proc.wait(timeout=30)
    assert temps(tmp_path) == [tmp]  # SIGKILL cannot be handled: it stays, for now
    live = subprocess.Popen(["sleep", "60"])  # a live writer's temp file must stay
    try:
        kept = tmp_path / f".cuvil-{live.pid:08x}-abc123.tmp"
        kept.write_text("being written")
        proc = _start(exe, out, slow=0)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert out.read_text().endswith("done\n")
        assert temps(tmp_path) == [kept]
    finally:
        live.kill()
        live.wait()


def test_executable_writes_a_250_character_name(exe, tmp_path):
    out = tmp_path / ("o" * 246 + ".txt")
    proc = _start(exe, out, slow=0)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert out.read_text().endswith("done\n")


def test_killed_build_leaves_nothing_after_the_next(tmp_path):
    cfg = write_config(tmp_path)
    cache, out = tmp_path / "cache", tmp_path / "dist" / "net"
    argv = [sys.executable, "-c", "import sys; from cuvil.cli import main; sys.exit(main())", "build",
            "--config", str(cfg), "--output", str(out), "--cache-dir", str(cache)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "compiler"),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    while not (cache.exists() and temps(cache)) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.005)
    proc.kill()
    proc.wait(timeout=30)
    left = temps(cache)
    assert left, "the build was not killed while writing a cache entry"
    # What an older killed build left beside the output, and a stray of a dead process.
    out.parent.mkdir(parents=True)
    (out.parent / f".cuvil-{dead_pid():08x}-zzzzzz.tmp").write_text("half an executable")
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert temps(tmp_path) == []
    assert os.access(out, os.X_OK)


def test_build_writes_a_250_character_output_name(exe, tmp_path):
    """The output copy's temporary name is 26 characters whatever the output's name."""
    d = exe[0].parent
    out = tmp_path / ("n" * 250)
    build(load_config(d / "config.yaml"), out, cache_dir=d / "cache", log=lambda s: None)
    assert os.access(out, os.X_OK) and temps(tmp_path) == []


def test_clean_stale_keeps_live_and_foreign_names(tmp_path):
    dead = tmp_path / f".cuvil-{dead_pid():08x}-abcdef.tmp"
    mine = tmp_path / f".cuvil-{os.getpid():08x}-abcdef.tmp"
    foreign = tmp_path / ".cuvil-notours.tmp"
    old_dir = tmp_path / f".cuvil-{dead_pid():08x}-dir000.tmp"
    for p in (dead, mine, foreign):
        p.write_text("x")
    (old_dir / "sub").mkdir(parents=True)
    assert sorted(clean_stale(tmp_path)) == sorted([dead, old_dir])
    assert mine.exists() and foreign.exists()
