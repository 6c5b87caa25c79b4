"""The summary actor: the utility-model client, its shared budget, one summary per episode (REQ-7).

Unconfigured (`[model_api]` absent or no `utility_model`, or `summary = false`) is a normal state that
falls back to no summary; a failing model never delays recording past 10 s (the deadline lives in
`modelapi.summarize_episode`).
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import trio

from ..config import ModelApiConfig
from ..metrics import Metrics
from ..modelapi import ModelApiClient, ModelApiSettings, SummaryResult, UtilityBudget, summarize_episode
from ..redact import redact
from .kernel import Ask, open_mailbox, serve


@attrs.frozen
class Summarize(Ask[SummaryResult]):
    """Summarise one episode: its text, and its id for the log line (never the text)."""

    episode_text: str
    episode_id: str | None = None


def model_api_settings(config: ModelApiConfig | None) -> ModelApiSettings | None:
    if config is None:
        return None
    api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
    return ModelApiSettings(
        base_url=config.base_url, api_key=api_key, utility_model=config.utility_model,
        embedding_model=config.embedding_model, requests_per_minute=config.requests_per_minute,
        daily_requests=config.daily_requests,
    )


class SummaryActor:
    def __init__(self, *, settings: ModelApiSettings | None, budget: UtilityBudget | None, metrics: Metrics) -> None:
        self._settings = settings
        self._budget = budget
        self._metrics = metrics
        self.address, self._mailbox = open_mailbox("summary", 16)

    @property
    def configured(self) -> bool:
        """Whether a utility model is configured: without one every summary is the `unconfigured`
        fallback, which needs neither this actor nor a log line per episode (the metric still counts it)."""
        return self._settings is not None and bool(self._settings.utility_model)

    async def summarize(self, text: str, episode_id: str | None = None) -> SummaryResult:
        """One episode summary (REQ-7). Unconfigured, the fallback is answered here and counted, without
        a mailbox round trip or a log line per episode (an IngestRuns batch of 500 logged 500 of them)."""
        if not self.configured:
            self._metrics.episode_summarised("fallback")
            return SummaryResult(None, "fallback", "unconfigured")
        return await self.address.ask(Summarize(text, episode_id))

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        client: ModelApiClient | None = None
        if self._settings is not None and self._settings.utility_model:
            client = ModelApiClient(self._settings, budget=self._budget)
        try:
            task_status.started(self.address)
            await serve(self._mailbox, lambda m: self._handle(client, m), concurrency=4)
        finally:
            if client is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await client.aclose()

    async def _handle(self, client: ModelApiClient | None, message: object) -> SummaryResult:
        match message:
            case Summarize(episode_text=text, episode_id=episode_id):
                result = await summarize_episode(client, text, redact=redact, episode=episode_id)
                self._metrics.episode_summarised(result.outcome)
                return result
            case _:
                raise TypeError(f"summary cannot handle {type(message).__name__}")
