# Two entry points a newcomer needs: `make run` and `make test`.
# Both create .venv when missing and install the project into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench clean

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

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/user_paths.py
	$(BIN)/python bench/recall_latency.py
	$(BIN)/python bench/read_side_faults.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
