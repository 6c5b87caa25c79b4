"""Plugin: the memory service in this process on a real config file and the test's store engine
(`config_path`, `make_holder`, `memory`), with its gateway on 127.0.0.1 (`served`), and a loopback model
API whose embeddings are bags of words (`bag_of_words_api`) with a client on it (`embed_client`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from memactors.config import ConfigHolder, load_config
from memactors.modelapi import ModelApiClient, ModelApiSettings
from memactors.service import MemoryService, open_memory_service
from memactors.testing.fake_model_api import FakeBehaviour, FakeModelApi, run_fake_model_api
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


@pytest.fixture
async def bag_of_words_api() -> AsyncIterator[FakeModelApi]:
    """A model API on loopback (the fake's real HTTP wire format) whose embeddings are 64-dimensional bags of
    words: a text's cosine to a question follows the words they share, so ranking tests can say what wins."""
    async with run_fake_model_api(behaviour=FakeBehaviour(embed_mode="bag_of_words", embed_dim=64)) as api:
        yield api


@pytest.fixture
async def embed_client(bag_of_words_api: FakeModelApi) -> AsyncIterator[ModelApiClient]:
    """A model API client on `bag_of_words_api`, its embedding model `fake-embed`, rate limits out of the way."""
    settings = ModelApiSettings(base_url=bag_of_words_api.base_url, api_key=None, utility_model=None,
                                embedding_model="fake-embed", requests_per_minute=6000, daily_requests=100000)
    async with ModelApiClient(settings) as client:
        yield client
