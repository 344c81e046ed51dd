# Two entry points, each doing all of its own set-up on a fresh machine:
#   make run   — the main job: a short standard sweep on this device into runs/dilcompile.duckdb,
#                printed as a table, then the dashboard on http://127.0.0.1:8501
#   make test  — the full test suite (JOBS pytest-xdist workers), then the Hugging Face tests
#                under the other end of the supported transformers range (tests/hf_versions.py)
#                and the compiling tests under the oldest supported torch (tests/torch_versions.py)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch==2.13.0 resolves to the local CPU build on the development machines;
# override with e.g. `make test TORCH=torch==2.11.0`.
TORCH ?= torch==2.13.0
PORT ?= 8501
# pytest-xdist workers; tests/conftest.py gives each its share of the cores.
JOBS ?= 2

.PHONY: run test setup browser clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[store,dashboard,test,triton,hf]'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/dilcompile profile --sweep quick --db runs/dilcompile.duckdb
	@echo "opening the dashboard at http://127.0.0.1:$(PORT) (Ctrl+C stops it)"
	$(BIN)/dilcompile dashboard --db runs/dilcompile.duckdb --port $(PORT)

# loadgroup: tests marked xdist_group share a worker (one wheel build, one browser at a time).
# torch 2.11's virtualenv (a few GB from PyPI, the first time) is built in the background while the
# main suite runs; a failed build is retried in the foreground by the torch-versions step, which shows why.
TORCH_INSTALL_LOG := $(VENV)/torch-versions-install.log
test: setup browser
	$(BIN)/python tests/torch_versions.py --install > $(TORCH_INSTALL_LOG) 2>&1 & installing=$$!; \
	  trap 'kill $$installing 2>/dev/null' INT TERM; \
	  $(BIN)/python -m pytest -q -n $(JOBS) --dist loadgroup; suite=$$?; \
	  wait $$installing || echo "torch-versions: the background install failed ($(TORCH_INSTALL_LOG)); retrying"; \
	  exit $$suite
	$(BIN)/python tests/hf_versions.py
	$(BIN)/python tests/torch_versions.py -n $(JOBS)

# The dashboard's browser test drives Debian's chromium through Playwright
# (Playwright's own browser downloads are not used). Installed when missing and root.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
	      || echo "WARNING: apt-get install chromium failed: the dashboard browser test will be SKIPPED"; \
	  else \
	    echo "WARNING: no chromium and not root with apt-get: the dashboard browser test will be SKIPPED" \
	         "(install the chromium package to run it)"; \
	  fi; }

clean:
	rm -rf $(VENV) .venv-torch* build *.egg-info
