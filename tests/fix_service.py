"""Plugin: the memory service in this process on a real config file and the test's store engine
(`config_path`, `make_holder`, `memory`), and with its gateway on 127.0.0.1 (`served`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from memactors.config import ConfigHolder, load_config
from memactors.service import MemoryService, open_memory_service
from support import RESIDENT, serving, wait_ready, write_config


@pytest.fixture
def config_path(tmp_path: Path, store_url: str | None) -> Path:
    return write_config(tmp_path, store_url=store_url)


@pytest.fixture
def make_holder(tmp_path: Path, store_url: str | None) -> Callable[[str], ConfigHolder]:
    def make(extra: str = "") -> ConfigHolder:
        path = write_config(tmp_path, extra, store_url=store_url)
        return ConfigHolder(lambda: load_config(path, env={"HOME": str(tmp_path)}))

    return make


@pytest.fixture
async def memory(make_holder: Callable[[str], ConfigHolder]) -> AsyncIterator[MemoryService]:
    """The embedded service on embedded defaults (built-in provider, summary without a model API)."""
    async with open_memory_service(make_holder("")) as service:
        await wait_ready(service)
        yield service



@pytest.fixture
async def served(make_holder: Callable[[str], ConfigHolder]) -> AsyncIterator[tuple[MemoryService, str]]:
    """A service with a resident claude-code harness (`RESIDENT`) and its gateway on 127.0.0.1: (service, url)."""
    async with serving(make_holder(RESIDENT)) as answer:
        yield answer
