# Two entry points, each doing all of its own set-up on a fresh machine:
#   make run   — the main job (demo: dilated attention vs dense SDPA on this device)
#   make test  — the full test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch==2.13.0 resolves to the local CPU build on the development machines;
# override with e.g. `make test TORCH=torch==2.11.0`.
TORCH ?= torch==2.13.0

.PHONY: run test setup clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[store,dashboard,test,triton]'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/dilcompile demo

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
