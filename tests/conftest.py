"""Shared fixtures: a real config file, a real SQLite state directory, real listeners on port 0."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from memactors.config import ConfigHolder, load_config
from memactors.service import MemoryService, open_memory_service
from support import wait_ready, write_config


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return write_config(tmp_path)


@pytest.fixture
def make_holder(tmp_path: Path) -> Callable[[str], ConfigHolder]:
    def make(extra: str = "") -> ConfigHolder:
        path = write_config(tmp_path, extra)
        return ConfigHolder(lambda: load_config(path, env={"HOME": str(tmp_path)}))

    return make


@pytest.fixture
async def memory(make_holder: Callable[[str], ConfigHolder]) -> AsyncIterator[MemoryService]:
    """The embedded service on embedded defaults (built-in provider, summary without a model API)."""
    async with open_memory_service(make_holder("")) as service:
        await wait_ready(service)
        yield service



@pytest.fixture(autouse=True)
def _collect_garbage_per_test() -> Iterator[None]:
    """Collect garbage after every test, so a leaked socket or process warns (and fails) in the test
    that leaked it, not in whichever later test the collector happens to run in."""
    yield
    gc.collect()
