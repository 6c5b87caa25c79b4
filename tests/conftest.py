"""The suite's own rules (no user profile, garbage collected per test, trio's clock, CPU notes) and the
plugins that provide the shared fixtures, each named for what it provides:

* fix_store: the store engine(s) and PostgreSQL clusters, `store_url`, `store`, `vector_url`, `vector_store_url`;
* fix_service: the service in this process (`config_path`, `make_holder`, `memory`, `served`) and
  `bag_of_words_api`;
* fix_providers: the fault provider's fork server and its helpers (`FaultFiles`, `fault_toml`, `sample`);
* fix_daemon: the daemon as a process (`Daemon`, `start_daemon`, `daemon_process`, `daemon_in_process`);
* fix_agents: the real agent CLIs, the configuration each needs to reach a loopback fake model API, and
  the `daemon` fixture (one per module, with the resident harness `coder`) the install tests share;
* fix_git: git with no repository above the test's directory and no user or system config (`isolated_git`).

Helpers with no fixture stay in support*.py (support.py: a real config file, the service's gateway)."""

from __future__ import annotations

import gc
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio.testing

pytest_plugins = ["fix_store", "fix_service", "fix_providers", "fix_daemon", "fix_agents", "fix_git"]

#: Variables of a user's own setup that would point a test, or an agent CLI it starts, at their files.
_PROFILE_VARS = ("HARNESS_CONFIG", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "CODEX_HOME", "CLAUDE_CONFIG_DIR",
                 "MEMACTORS_HARNESS", "MEMACTORS_RUN_TOKEN")


@pytest.fixture(scope="session", autouse=True)
def _no_user_profile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite never reads the user's own configuration: HOME is an empty directory of this session's
    and the variables above are unset, for the tests and every process they start. `make test` once
    passed or failed by what the user's profile held; each test passes what it needs."""
    saved = {name: os.environ.get(name) for name in ("HOME", *_PROFILE_VARS)}
    os.environ["HOME"] = str(tmp_path_factory.mktemp("home"))
    for name in _PROFILE_VARS:
        os.environ.pop(name, None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def trio_clock() -> trio.testing.MockClock:
    """trio's clock for the test (pytest-trio runs the test on it): real time, until `support.within`
    freezes it to show that a call is answered within a budget of trio time."""
    return trio.testing.MockClock(rate=1.0)


@pytest.fixture(autouse=True)
def _collect_garbage_per_test() -> Iterator[None]:
    """Collect garbage after every test, so a leaked socket or process warns (and fails) in the test
    that leaked it, not in whichever later test the collector happens to run in.

    Then freeze what survived (gc.freeze): the next collection scans only what later tests allocate.
    Every object a test creates is still collected at its end; what is frozen is what outlived its test
    (imported modules, pydantic's models, caches), which a full collection walked again after every test:
    ~0.09 s of CPU a test, 985 times. pytest_sessionfinish unfreezes and collects what became garbage."""
    yield
    gc.collect()
    gc.freeze()



_CPU_DIR = os.environ.get("MEMACTORS_TEST_CPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:  # noqa: ARG001
    """With MEMACTORS_TEST_CPU=<dir>, note each test's CPU (this process and its reaped children) and
    wall into <dir>/<worker>.tsv, to rank tests by the CPU they cost, not only by their wall time."""
    if not _CPU_DIR:
        yield
        return

    def cpu() -> tuple[float, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime

    own0, kids0 = cpu()
    wall0 = time.monotonic()
    yield
    own1, kids1 = cpu()
    out = Path(_CPU_DIR) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.tsv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", encoding="utf-8") as f:
        f.write(f"{item.nodeid}\t{own1 - own0:.3f}\t{kids1 - kids0:.3f}\t{time.monotonic() - wall0:.3f}\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:  # noqa: ARG001
    gc.unfreeze()
    gc.collect()
