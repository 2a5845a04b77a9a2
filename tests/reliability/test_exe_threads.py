"""The executable's default thread count is the config's `optimize.threads` (issue 33):
a post-processing plugin linked in counts the process's threads (/proc/self/task) after
the run, when the pool's workers are still alive, and writes the count as --output."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cuvil.build import build
from cuvil.config import load_config

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/task")

MODEL = '''
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 32 * 32, 64)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))

def make():
    return Net().eval(), (torch.randn(1, 3, 32, 32),)
'''

PLUGIN = r'''
#include <dirent.h>
#include "cuvil_plugin.h"

static cuvil_status count_threads(void *state, int n, const cuvil_tensor_desc *outputs, const void *const *data,
                                  const cuvil_writer *out) {
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int threads = 0;
    (void)state; (void)n; (void)outputs; (void)data;
    if (d == NULL) return cuvil_fail(CUVIL_ERR_IO, "cannot open /proc/self/task");
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') threads++;
    closedir(d);
    return cuvil_writef(out, "%d\n", threads);
}
CUVIL_PLUGIN(thread_count, .postprocess = count_threads);
'''


def _config(tmp_path, threads: int | None):
    (tmp_path / "net.py").write_text(MODEL)
    (tmp_path / "thread_count.c").write_text(PLUGIN)
    optimize = f"optimize: {{threads: {threads}}}\n" if threads else ""
    (tmp_path / "config.yaml").write_text(textwrap.dedent("""\
        model: {framework: pytorch, source: net.py, entry: make}
        inputs: [{name: x, shape: [1, 3, 32, 32]}]
        plugin:
          modules: [thread_count.c]
          postprocess: {plugin: thread_count}
        """) + optimize)
    return load_config(tmp_path / "config.yaml")


@pytest.fixture(scope="module")
def exes(tmp_path_factory):
    out = {}
    cache = tmp_path_factory.mktemp("cache")
    for threads in (2, None):
        d = tmp_path_factory.mktemp(f"t{threads}")
        out[threads] = build(_config(d, threads), d / "net", cache_dir=cache, log=lambda s: None)
    x = tmp_path_factory.mktemp("in") / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32))
    return out, x


def _threads(exe, x, tmp_path, *args) -> int:
    out = tmp_path / "count.txt"
    r = subprocess.run([str(exe), "--input", str(x), "--output", str(out), *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return int(out.read_text())


def test_built_with_two_threads_runs_two(exes, tmp_path):
    (built, x) = exes
    assert _threads(built[2], x, tmp_path) == 2
    assert _threads(built[2], x, tmp_path, "--threads", "1") == 1  # --threads still overrides
    assert _threads(built[None], x, tmp_path) == 1                 # no optimize.threads: 1
    assert _threads(built[None], x, tmp_path, "--threads", "3") == 3


def test_help_names_the_default(exes):
    (built, _) = exes
    for threads, want in ((2, 2), (None, 1)):
        r = subprocess.run([str(built[threads]), "--help"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0
        assert f"--threads N         threads to run on (default {want}: the config's optimize.threads)" in r.stdout
