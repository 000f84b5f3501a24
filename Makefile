# `make quickstart`: virtual environment + install + the main job. `make test`: the same with test extras + tests.
# Torch is pinned to the CPU wheel first, so the package's `torch` range is already satisfied and no CUDA
# packages are pulled in.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The tested versions (constraints.txt) on the Python they were tested on; elsewhere, or with `CONSTRAINTS=`, the newest
# releases pyproject.toml's ranges allow.
CONSTRAINTS ?= $(if $(filter 3.11,$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')),constraints.txt)
PIP_CONSTRAINTS := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

.PHONY: quickstart test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e . $(PIP_CONSTRAINTS)
	touch $@

$(VENV)/.installed-test: pyproject.toml constraints.txt $(VENV)/.installed
	$(BIN)/pip install -q -e ".[test]" $(PIP_CONSTRAINTS)
	touch $@

quickstart: $(VENV)/.installed
	$(BIN)/hf-scratch train --output-dir outputs/quickstart --overwrite-output-dir --max-minutes 3.5

test: $(VENV)/.installed-test
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=15

clean:
	rm -rf $(VENV) outputs .hf_conformance
