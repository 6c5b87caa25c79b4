# Two entry points a newcomer needs: `make run` and `make test`.
# Both create .venv when missing and install the project into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast test-tools lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/memactors serve

lint: $(STAMP)
	$(BIN)/ruff check --no-cache src tests bench

# Parallel (pytest-xdist): every test uses its own tmp dir and port 0. Slow end-to-end tests
# (marked `slow`) run too; `make test-fast` skips them while you iterate.
PYTEST_WORKERS ?= 4

test: $(STAMP) lint test-tools
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# The TUI is tested in a real terminal under tmux: install it when missing (CI runs as root).
test-tools:
	@command -v tmux >/dev/null || (apt-get update -qq && apt-get install -y -qq tmux >/dev/null)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "not slow"

bench: $(STAMP)
	$(BIN)/python bench/user_paths.py
	$(BIN)/python bench/recall_latency.py
	$(BIN)/python bench/read_side_faults.py
	$(BIN)/python bench/cli_startup.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
