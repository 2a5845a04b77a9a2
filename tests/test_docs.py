"""The README and docs/ describe the code as it is: every command in them runs.

- Each line of a ```sh block (after joining `\\` continuations and dropping `# comments`)
  is a command. A command listed in EXTERNAL is run elsewhere: by `.ci/run`, a Makefile
  target, tests/bazel, tests/remote or another test file; the test checks that the place
  really holds it (every evidence pattern must match its file). Every other command runs
  here, in one working directory, document after document in DOCS order (README.md
  first: it writes mlp.yaml, x.npy and dist/mlp, which the pages after it use), with
  this interpreter's bin directory first on PATH and this checkout's compiler on
  PYTHONPATH; each must exit with status 0, and EXPECT names output some must print.
- A ```c block whose first line is a comment naming a file (`/* app.c: ... */`) is
  written to that file before its document's commands run.
- ```python blocks run in-process, in order, one namespace and one temporary directory
  per document, except those listed in EXTERNAL_PYTHON (covered by another test file).
- Other fences (text, yaml, starlark, c without a file name) are not run: they show
  file contents or output, not commands.

Also here: every config key of the schema is in docs/config.md, every command-line
option in docs/cli.md, relative links resolve, the README stays short, and the
benchmark script writes benchmarks/RESULTS.md (the writer is unit-tested; the full
benchmark takes minutes).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
# The order the commands run in: a page may use what the pages before it made.
DOCS = ["README.md", "docs/cli.md", "docs/config.md", "docs/targets.md", "docs/quantization.md", "docs/abi.md",
        "docs/plugins.md", "docs/dynamic-shapes.md", "docs/python-api.md", "docs/frameworks.md", "docs/bazel.md",
        "docs/rules-reference.md", "docs/remote.md", "docs/architecture.md", "docs/reliability.md"]
README_MAX_LINES = 200

CI = ".ci/run"
MAKEFILE = "Makefile"
BAZEL_TARGETS = "tests/bazel/test_targets.py"
BAZEL_QUANT = "tests/bazel/test_quantization.py"
BAZEL_MONOREPO = "tests/bazel/test_monorepo.py"
REMOTE_CONFTEST = "tests/remote/conftest.py"
REMOTE_HELPERS = "tests/remote/remote_helpers.py"
IMAGES = "tests/targets/test_images.py"
INIT_RESNET50 = "tests/cli/test_init_resnet50.py"

# command -> [(file, regex), ...]: where the command runs (each regex must match the file).
EXTERNAL: dict[str, list[tuple[str, str]]] = {
    # README: the two commands
    "make all": [(MAKEFILE, r"(?m)^all: setup demo$"),
                 (MAKEFILE, r"(?m)^demo: setup\n\t\$\(PY\) examples/demo\.py\n\t\$\(VENV\)/bin/cuvil build")],
    "make test": [(CI, r"(?m)^make test$")],
    "make setup": [(MAKEFILE, r"(?m)^setup: system-packages bazel-packages remote-packages \$\(STAMP\)$"),
                   (MAKEFILE, r"(?m)^test: setup$")],
    # Bazel (.ci/run builds and tests //..., then runs tests/bazel)
    "bazel build //...": [(CI, r"(?m)^bazel build .*//\.\.\.$")],
    "bazel test //...": [(CI, r"(?m)^bazel test .*//\.\.\.$")],
    # README: the external workspace made from its snippets (tests/bazel/test_monorepo.py)
    "bazel build //models:app //models:resnet50_aarch64 --@cuvil//cuvil:quantization=fp16": [
        (BAZEL_MONOREPO, r'README_BUILD = \["//models:app", "//models:resnet50_aarch64"\]'),
        (BAZEL_MONOREPO, r'FP16 = "--@cuvil//cuvil:quantization=fp16"'),
        (BAZEL_MONOREPO, r'_build\(mono, log, \*README_BUILD, FP16\)')],
    "qemu-aarch64 -L /usr/aarch64-linux-gnu bazel-bin/models/resnet50_aarch64 --input x.npy --output y.npy": [
        (BAZEL_TARGETS, r'QEMU = \["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"\]'),
        (BAZEL_MONOREPO, r'a64 = .*bazel\.bin\("models/resnet50_aarch64"\)'),
        (BAZEL_MONOREPO, r'run\(\[\*QEMU, a64, "--input", tmp_path / "x\.npy", "--output", tmp_path / "a64\.npy"\]\)')],
    "bazel build //examples/models:resnet50_aarch64": [
        (BAZEL_TARGETS, r'bazel\.build\(f"//examples/models:\{model\}_aarch64"'),
        (BAZEL_TARGETS, r'\("resnet50", "random"\)')],
    "qemu-aarch64 -L /usr/aarch64-linux-gnu bazel-bin/examples/models/resnet50_aarch64 --input x.npy --output y.npy": [
        (BAZEL_TARGETS, r'QEMU = \["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"\]'),
        (BAZEL_TARGETS, r'run\(\[\*QEMU, a64, "--input", tmp_path / "x\.npy", "--output", tmp_path / "aarch64\.npy"\]\)')],
    "bazel build //examples/models:mobilenetv2_int8_host": [
        (BAZEL_QUANT, r'bazel\.build\("//examples/models:mobilenetv2_int8_host"')],
    "bazel build //tests/bazel:mlp_host --//cuvil:precision=bf16 --platforms=//platforms:linux_x86_64_avx512": [
        (BAZEL_QUANT, r'bazel\.build\("//tests/bazel:mlp_host", "--//cuvil:precision=bf16", '
                      r'"--platforms=//platforms:linux_x86_64_avx512"\)')],
    ".venv/bin/python -m pytest -q tests/bazel": [(CI, r"(?m)^\.venv/bin/python -m pytest -q tests/bazel$")],
    # remote cache and execution (tests/remote, a step of .ci/run)
    ".venv/bin/python -m pytest -q tests/remote": [(CI, r"(?m)^timeout .* \.venv/bin/python -m pytest -q tests/remote$")],
    "bazel build --config=remote-cache //examples/models:resnet50_aarch64": [
        (REMOTE_CONFTEST, r'"--config=remote-cache"'), (REMOTE_CONFTEST, r"bazel\.build\(\*ALL_TARGETS"),
        (REMOTE_HELPERS, r'"//examples/models:resnet50_aarch64"')],
    "bazel build --config=remote //examples/models:resnet50_aarch64 //examples/models:mobilenetv2_aarch64": [
        (REMOTE_CONFTEST, r'"--config=remote"'), (REMOTE_CONFTEST, r"bazel\.build\(\*MODEL_TARGETS"),
        (REMOTE_HELPERS, r'"//examples/models:resnet50_aarch64"'),
        (REMOTE_HELPERS, r'"//examples/models:mobilenetv2_aarch64"')],
    "bazel test --config=remote //examples/cpp_app:cpp_app_test": [
        (REMOTE_CONFTEST, r"bazel\.test\(CPP_APP_TEST, \*flags"),
        (REMOTE_HELPERS, r'CPP_APP_TEST = "//examples/cpp_app:cpp_app_test"')],
    "python tools/remote/cuvil_remote.py interpreter /opt/cuvil/python": [
        (REMOTE_CONFTEST, r"cuvil_remote\.make_interpreter\("), (".bazelrc", r"CUVIL_PYTHON=/opt/cuvil/python/bin/python")],
    "python tools/remote/cuvil_remote.py nginx /var/tmp/cuvil-cache --port 8080 &": [
        (REMOTE_CONFTEST, r"cuvil_remote\.start_nginx\(")],
    "bazel build --config=remote-cache --remote_cache=http://127.0.0.1:8080 //tests/remote:tiny_aarch64": [
        (REMOTE_CONFTEST, r'\["--config=remote-cache", f"--remote_cache=\{self\.nginx\.url\}"'),
        (REMOTE_HELPERS, r'"//tests/remote:tiny_aarch64"')],
    "python tools/remote/cuvil_remote.py build-worker /var/tmp/cuvil-worker-build": [
        (REMOTE_CONFTEST, r"cuvil_remote\.build_worker\(")],
    "python tools/remote/cuvil_remote.py worker /var/tmp/cuvil-worker --port 8980 "
    "--classes /var/tmp/cuvil-worker-build/classes --hide \"$PWD/compiler\" &": [
        (REMOTE_CONFTEST, r"cuvil_remote\.start_worker\(.*hide=hide")],
    "bazel build --config=remote --remote_executor=grpc://127.0.0.1:8980 //tests/remote:tiny_aarch64": [
        (REMOTE_CONFTEST, r'\["--config=remote", f"--remote_executor=\{self\.worker\.url\}"'),
        (REMOTE_HELPERS, r'"//tests/remote:tiny_aarch64"')],
    # docs/targets.md: MobileNetV2 on a photo for aarch64 and wasm32 (tests/targets/test_images.py
    # builds it for every target and runs it on seven photos)
    "cuvil build --config mobilenet_v2.yaml --output dist/mobilenet_v2_arm --target aarch64-linux-gnu": [
        (IMAGES, r'"init", "--template", "pytorch-mobilenetv2", str\(config\)'),
        (IMAGES, r'"build", "--config", str\(config\), "--output", str\(exe\), "--target", target'),
        (IMAGES, r'TARGETS = \[.*"aarch64-linux-gnu"')],
    "cuvil run dist/mobilenet_v2_arm --input cat.jpg --output cat_arm.json": [
        (IMAGES, r'"run", str\(exe\), "--input", str\(photos\[0\]\), "--output"'),
        (IMAGES, r'"cat\.jpg": \("cat\.jpg", None, None\)')],
    "cuvil build --config mobilenet_v2.yaml --output dist/mobilenet_v2.wasm --target wasm32-wasi": [
        (IMAGES, r'"build", "--config", str\(config\), "--output", str\(exe\), "--target", target'),
        (IMAGES, r'TARGETS = \[.*"wasm32-wasi"')],
    "cuvil run dist/mobilenet_v2.wasm --input cat.jpg --output cat_wasm.json": [
        (IMAGES, r'"run", str\(exe\), "--input", str\(photos\[0\]\), "--output"')],
    # the plugin examples and the dynamic BERT executable build minutes-long models
    "cuvil build --config examples/plugins/detector.yaml --output dist/detector": [
        ("tests/plugins/test_plugins.py", r'build\(load_config\(EXAMPLE / "detector\.yaml", target=target\)')],
    "cuvil run dist/detector --input photo.ppm --output detections.json": [
        ("tests/plugins/test_plugins.py", r'run\(exe, "--input", tmp_path / "photo\.ppm", "--output", '
                                          r'tmp_path / "detections\.json"\)'),
        ("tests/targets/helpers.py", r"subprocess\.run\(run_command\(exe\)")],   # what `cuvil run` runs
    "cuvil build --config examples/bert_dynamic.yaml --output dist/bert_dynamic": [
        ("tests/dynamic/test_models.py", r'"build", "--config",\s*str\(ROOT / "examples" / "bert_dynamic\.yaml"\)')],
    "./dist/bert_dynamic --input input_ids=ids.npy --input attention_mask=mask.npy --output out.npy": [
        ("tests/dynamic/test_models.py", r'"--input", f"input_ids=\{tmp / \'ids\.npy\'\}", "--input",\s*'
                                         r'f"attention_mask=\{tmp / \'mask\.npy\'\}", "--output"')],
    # docs/cli.md: the ResNet-50 template's three commands, run verbatim in an empty directory
    **{c: [(INIT_RESNET50, re.escape(f'"{c}",')),
           (INIT_RESNET50, r'for command in MANUAL:\n\s+proc = subprocess\.run\(\["bash", "-c", command\], cwd=work,')]
       for c in (
        "cuvil init --template pytorch-resnet50 config.yaml",
        "cuvil build --config config.yaml --output ./dist/resnet50-cuvil",
        "./dist/resnet50-cuvil --input examples/cat.jpg --output pred.json")},
}

# (document, a line of the block) -> where the ```python block runs instead.
EXTERNAL_PYTHON: dict[tuple[str, str], list[tuple[str, str]]] = {
    # importing TensorFlow alone takes ~15 s here; tests/tf compiles the same Keras model
    ("docs/frameworks.md", "import keras"): [
        ("tests/tf/test_tf.py", r'keras\.Sequential\(\[keras\.Input\(\(20,\), batch_size=1\), '
                                r'keras\.layers\.Dense\(32, activation="tanh"\)'),
        ("tests/tf/test_tf.py", r"compiled = cuvil\.compile\(model, inputs\)")],
}

# command -> text its output (stdout and stderr) must contain
EXPECT = {
    "./dist/mlp --help": "usage: mlp --input FILE",
    "cuvil inspect mlp.cvir --summary": "// arena size:",
    "cuvil inspect mlp.cvir --target aarch64-linux-gnu --features +neon,+dotprod":
        'kernel_target = {bf16 = [2, "bf16"], int8 = [4, "sdot"], lanes = 4}',
    "cuvil inspect mlp.cvir --target x86_64-linux-gnu --cpu x86-64-v3":
        'kernel_plan = {form = "packed", lanes = 8, weights = "panels"}',
    "cuvil inspect out/mlp": "model mlp for x86_64-unknown-linux-gnu",
    "cuvil inspect out/mlp/mlp.json": "// manifest mlp.json: model mlp for x86_64-unknown-linux-gnu",
    "cuvil inspect dist/mlp_arm": "model mlp for aarch64-unknown-linux-gnu",
    "cuvil quant-report --config mlp.yaml --quantization fp16": "quantization report: mlp, fp16",
    "./dist/app": "x: arena ",
}


# --- reading the documents -------------------------------------------------------------

FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)


def blocks(doc: str) -> list[tuple[str, str, int]]:
    """(fence tag, body, line number) of each fenced block of a document."""
    text = (REPO / doc).read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def _strip_comment(line: str) -> str:
    """The line without a shell comment (a `#` at the start or after a blank, outside quotes)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def commands(body: str) -> list[str]:
    out, pending = [], ""
    for raw in body.splitlines():
        line = _strip_comment(raw).rstrip()
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = " ".join((pending + line.strip()).split())
        pending = ""
        if line:
            out.append(line)
    return out


def doc_commands(doc: str) -> list[tuple[str, int]]:
    return [(c, line) for tag, body, line in blocks(doc) if tag == "sh" for c in commands(body)]


def all_commands() -> list[tuple[str, str, int]]:
    return [(doc, c, line) for doc in DOCS for c, line in doc_commands(doc)]


# --- the documents and the tables agree ----------------------------------------------------

def test_docs_folder_is_listed():
    found = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert found == set(DOCS) - {"README.md"}, "add new pages to DOCS (in the order their commands run)"


def test_readme_is_a_short_page_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move details into docs/"
    first = next(body for tag, body, _ in blocks("README.md") if tag == "sh")
    assert commands(first) == ["make all", "make test"]


def test_only_known_fences():
    for doc in DOCS:
        for tag, body, line in blocks(doc):
            assert tag in ("sh", "python", "text", "yaml", "starlark", "c"), f"{doc}:{line}: fence {tag!r}"


@pytest.mark.parametrize("command", sorted(EXTERNAL))
def test_external_command_runs_where_the_table_says(command):
    assert command in {c for _, c, _ in all_commands()}, f"{command!r} is in EXTERNAL but in no document"
    for path, pattern in EXTERNAL[command]:
        text = (REPO / path).read_text()
        assert re.search(pattern, text), f"{command!r}: {path} does not match {pattern!r}"


@pytest.mark.parametrize("key", sorted(EXTERNAL_PYTHON))
def test_external_python_runs_where_the_table_says(key):
    doc, line = key
    assert any(tag == "python" and line in body.splitlines() for tag, body, _ in blocks(doc)), key
    for path, pattern in EXTERNAL_PYTHON[key]:
        assert re.search(pattern, (REPO / path).read_text()), f"{key}: {path} does not match {pattern!r}"


def test_expected_outputs_belong_to_documented_commands():
    documented = {c for _, c, _ in all_commands()}
    assert set(EXPECT) <= documented - set(EXTERNAL)


def test_every_config_key_is_in_the_config_reference():
    from cuvil.config import SCHEMA
    text = FENCE.sub("", (REPO / "docs" / "config.md").read_text())
    in_code = " ".join(re.findall(r"`([^`]+)`", text))

    def keys(schema):
        for name, sub in (schema.get("properties") or {}).items():
            yield name
            for part in [sub, sub.get("items") or {}, sub.get("additionalProperties") or {}]:
                if isinstance(part, dict):
                    yield from keys(part)
    missing = sorted({k for k in keys(SCHEMA) if not re.search(rf"(?<![\w-]){re.escape(k)}(?![\w-])", in_code)})
    assert not missing, f"docs/config.md does not mention these config keys: {missing}"


def test_every_command_line_option_is_in_the_cli_page():
    import argparse

    from cuvil.cli import build_parser
    text = (REPO / "docs" / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        assert f"cuvil {name}" in text, name
        for action in parser._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt != "--help":
                    assert opt in text, f"docs/cli.md does not mention `cuvil {name} {opt}`"


def test_relative_links_resolve():
    for doc in DOCS:
        path = REPO / doc
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            assert dest.exists(), f"{doc}: link to {target}: no such file"
            if anchor and dest.suffix == ".md":
                headings = re.findall(r"(?m)^#+ (.+)$", dest.read_text())
                slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
                assert anchor in slugs, f"{doc}: link to {target}: no such heading"


# --- running them -----------------------------------------------------------------------------

def _env() -> dict:
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "cuvil").exists():
        pytest.fail(f"no `cuvil` next to {sys.executable}: run the tests with the .venv that `make setup` makes")
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "compiler"), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _c_files(doc: str) -> dict[str, str]:
    """`/* name.c: ... */` blocks of a document: name -> text."""
    out = {}
    for tag, body, _ in blocks(doc):
        m = re.match(r"/\* ([\w.-]+\.c)\b", body)
        if tag == "c" and m:
            out[m.group(1)] = body
    return out


def test_doc_commands_run(tmp_path):
    """README.md, then every page, in one directory: each command not in EXTERNAL."""
    env = _env()
    ran = []
    for doc in DOCS:
        for name, text in _c_files(doc).items():
            (tmp_path / name).write_text(text)
        for command, line in doc_commands(doc):
            if command in EXTERNAL:
                continue
            proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=600)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 0, f"{doc}:{line}: `{command}` exited {proc.returncode}:\n{out[-3000:]}"
            if command in EXPECT:
                assert EXPECT[command] in out, f"{doc}:{line}: `{command}` did not print {EXPECT[command]!r}:\n{out}"
            ran.append(command)
    assert "cuvil init --template pytorch-mlp mlp.yaml" in ran

    # What the commands made is what the pages say.
    pred = json.loads((tmp_path / "pred.json").read_text())
    assert len(pred["top_k"]) == 3
    host = np.load(tmp_path / "y.npy")
    assert host.shape == (1, 10)
    for other in ("y_arm.npy", "y_wasm.npy"):  # docs/targets.md: within 1e-4 of the host's
        np.testing.assert_allclose(np.load(tmp_path / other), host, atol=1e-4 * float(np.abs(host).max()))
    manifest = json.loads((tmp_path / "out" / "mlp_bf16" / "mlp.json").read_text())
    assert manifest["precision"]["compute"] == "bf16" and manifest["precision"]["kernel"] in ("dpbf16ps", "bf16")
    manifest = json.loads((tmp_path / "out" / "mlp_int8" / "mlp.json").read_text())
    assert manifest["quantization"]["method"] == "int8_sym"
    avx2 = json.loads((tmp_path / "out" / "mlp_avx2" / "mlp.json").read_text())
    assert avx2["target"]["cpu"] == "x86-64-v3" and "+avx2" in avx2["target"]["features"]


def _python_docs():
    return [doc for doc in DOCS if any(tag == "python" for tag, _, _ in blocks(doc))]


@pytest.mark.parametrize("doc", _python_docs())
def test_doc_python_snippets_run(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{Path(doc).stem}"}
    ran = 0
    for tag, body, line in blocks(doc):
        if tag != "python" or any(d == doc and key in body.splitlines() for d, key in EXTERNAL_PYTHON):
            continue
        try:
            exec(compile(body, f"{doc}:{line}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"the python block at {doc}:{line} failed: {type(e).__name__}: {e}") from e
        ran += 1
    assert ran


# --- benchmarks/RESULTS.md ------------------------------------------------------------------

def _compare():
    spec = importlib.util.spec_from_file_location("cuvil_benchmarks_compare", REPO / "benchmarks" / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_writes_results_md_by_default_except_for_smoke_runs(tmp_path):
    compare = _compare()
    assert compare.RESULTS_MD == REPO / "benchmarks" / "RESULTS.md"
    assert compare.parse_args([]).results == compare.RESULTS_MD
    assert compare.parse_args(["--quick"]).results is None            # tests/benchmarks' smoke run leaves it alone
    assert compare.parse_args(["--quick", "--results", str(tmp_path / "r.md")]).results == tmp_path / "r.md"
    assert compare.parse_args(["--no-results"]).results is None


def test_results_writer(tmp_path):
    compare = _compare()
    rows = []
    for system, ms in (("cuvil", 10.0), ("cuvil-bf16", 6.0), ("ort", 12.5), ("ov-f32", 11.0), ("ov-default", 5.0)):
        for threads in (1, 2):
            rows.append({"model": "mlp", "title": "MLP 784-512-512-10 b1", "threads": threads, "system": system,
                         "label": compare.bs.LABELS[system], "status": "ok", "median_ms": ms / threads})
    rows.append({"model": "mlp", "title": "MLP 784-512-512-10 b1", "threads": 1, "system": "torch",
                 "label": "torch eager", "status": "skipped", "reason": "not installed"})
    results = {
        "machine": {"git": "abc1234-dirty", "date": "2026-12-07T10:00:00+00:00", "cpu": "Test CPU", "affinity": 2,
                    "isa": ["avx2", "fma"], "platform": "Linux-x86_64", "versions": {"torch": "2.13.0"}},
        "settings": {"models": ["mlp"], "systems": [k for k, _ in compare.bs.SYSTEMS], "threads": [1, 2],
                     "reps": 3, "gap_s": 0.1, "quick": False},
        "latency": rows,
        "cold_start": [{"model": "mlp", "system": "cuvil", "label": "Cuvil fp32", "status": "ok",
                        "cold_start_ms": 7.5, "peak_rss_mib": 20.0, "artifact_bytes": 3 << 20}],
        "gemm": [{"m": 64, "k": 64, "n": 64, "threads": 1, "cuvil_gflops": 50.0, "cuvil_efficiency": 0.9,
                  "numpy_gflops": 40.0, "numpy_efficiency": 0.72}],
        "peak": [{"threads": 1, "gflops": 55.5, "isa": "avx2"}],
    }
    out = tmp_path / "sub" / "RESULTS.md"
    compare.write_results(results, out, "python benchmarks/compare.py --reps 3")
    text = out.read_text()
    assert [p.name for p in out.parent.iterdir()] == ["RESULTS.md"]      # written through a temporary file
    for want in ("- commit: `abc1234-dirty`", "- machine: Test CPU, 2 CPUs (avx2, fma)",
                 "- command: `python benchmarks/compare.py --reps 3`", "3 interleaved repetitions",
                 "| MLP 784-512-512-10 b1 | 10.00 / 5.00 | 6.00 / 3.00 | skipped / - | 12.50 / 6.25 |",
                 "| MLP 784-512-512-10 b1 | 0.80 / 0.80 | 0.91 / 0.91 | 1.20 / 1.20 |",
                 "| 64x64x64 | 1 | 50.0 | 90% | 40.0 | 72% |", "FMA 55.5 GFLOP/s at 1 thread(s)",
                 "| MLP 784-512-512-10 b1 | Cuvil fp32 | 7.5 ms | 20.0 MiB | 3.0 MiB |"):
        assert want in text, want
    assert text.endswith("\n") and "## Notes" not in text


def test_checked_in_results_name_commit_machine_and_command():
    text = (REPO / "benchmarks" / "RESULTS.md").read_text()
    assert "Written by `benchmarks/compare.py`" in text
    for field in ("commit", "date", "machine", "versions", "command"):
        assert re.search(rf"(?m)^- {field}: \S", text), field
    assert re.search(r"(?m)^- command: `python benchmarks/compare\.py", text)
    assert "## Latency, batch 1" in text
