"""Metrics: REQ-21's families over real HTTP, label vocabularies, and the provider_up rule."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest
import trio

from fix_providers import sample
from memactors.metrics import FAMILY_NAMES, FLEET_FAMILY_NAMES, OTHER_HARNESS, Metrics, serve_metrics


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(max_harnesses=3)


@pytest.fixture
async def base_url(nursery: trio.Nursery, metrics: Metrics) -> AsyncIterator[str]:
    host, port = await nursery.start(serve_metrics, metrics, "127.0.0.1", 0)
    yield f"http://{host}:{port}"


async def scrape(base_url: str) -> str:
    async with httpx2.AsyncClient() as client:
        response = await client.get(base_url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


@pytest.mark.req21
async def test_req21_every_family_is_exposed_before_any_sample(base_url: str) -> None:
    text = await scrape(base_url)
    for name in FAMILY_NAMES + FLEET_FAMILY_NAMES:
        assert f"# TYPE {name} " in text, name
    types = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")}
    assert types["harness_memory_episodes_recorded_total"] == "counter"
    assert types["harness_memory_provider_up"] == "gauge"
    assert types["harness_memory_provider_duration_seconds"] == "histogram"
    assert types["harness_memory_pending"] == "gauge"
    assert types["harness_memory_run_duration_seconds"] == "histogram"
    # Nothing in the harness_memory_ namespace but REQ-21's families and the fleet families (installs, residents, imports).
    ours = {n for n in types if n.startswith("harness_memory_")}
    assert ours == set(FAMILY_NAMES) | set(FLEET_FAMILY_NAMES)


@pytest.mark.req21
async def test_req21_label_names_are_the_spec_s(metrics: Metrics, base_url: str) -> None:
    metrics.episode_recorded("builtin", "ok")
    metrics.episode_summarised("fallback")
    metrics.set_provider_up("builtin", True)
    metrics.observe_provider_call("builtin", "recall", 0.02)
    metrics.recall("builtin", "degraded")
    metrics.dropped("builtin", "forgotten")
    metrics.briefing("claude", "prompt", "ok", size_bytes=1200)
    metrics.set_pending("builtin", "forget", 3)
    text = await scrape(base_url)
    assert sample(text, "harness_memory_episodes_recorded_total", provider="builtin", outcome="ok") == 1
    assert sample(text, "harness_memory_episode_summaries_total", outcome="fallback") == 1
    assert sample(text, "harness_memory_provider_up", provider="builtin") == 1
    assert (
        sample(text, "harness_memory_provider_duration_seconds_count", provider="builtin", op="recall") == 1
    )
    assert sample(text, "harness_memory_recalls_total", provider="builtin", outcome="degraded") == 1
    assert sample(text, "harness_memory_results_dropped_total", provider="builtin", reason="forgotten") == 1
    assert (
        sample(text, "harness_memory_briefings_total", harness="claude", delivery="prompt", outcome="ok") == 1
    )
    assert sample(text, "harness_memory_briefing_bytes", harness="claude") == 1200
    assert sample(text, "harness_memory_pending", provider="builtin", kind="forget") == 3


@pytest.mark.req21
async def test_req21_no_provider_reading_yet(metrics: Metrics, base_url: str) -> None:
    metrics.recall("builtin", "ok")  # other activity must not create the series
    text = await scrape(base_url)
    assert "# TYPE harness_memory_provider_up gauge" in text
    assert not [line for line in text.splitlines() if line.startswith("harness_memory_provider_up")]

    metrics.set_provider_up("builtin", False)
    text = await scrape(base_url)
    assert sample(text, "harness_memory_provider_up", provider="builtin") == 0


@pytest.mark.req21
async def test_req21_scope_drops_are_countable(metrics: Metrics, base_url: str) -> None:
    metrics.dropped("builtin", "scope")  # an earlier recall
    before = sample(
        await scrape(base_url), "harness_memory_results_dropped_total", provider="builtin", reason="scope"
    )
    assert before == 1
    # One recall returns two out-of-scope items.
    metrics.dropped("builtin", "scope")
    metrics.dropped("builtin", "scope")
    after = sample(
        await scrape(base_url), "harness_memory_results_dropped_total", provider="builtin", reason="scope"
    )
    assert after == before + 2


@pytest.mark.req21
@pytest.mark.parametrize(
    "bad",
    [
        lambda m: m.episode_recorded("builtin", "failed"),
        lambda m: m.episode_summarised("none"),
        lambda m: m.recall("builtin", "ok; DROP TABLE"),
        lambda m: m.observe_provider_call("builtin", "search", 0.1),
        lambda m: m.dropped("builtin", "too old"),
        # Not one of REQ-9's reasons: a replaced text is kept, and counted in its own series.
        lambda m: m.dropped("builtin", "text_replaced"),
        lambda m: m.set_pending("builtin", "summary", 1),
        lambda m: m.briefing("claude", "email", "ok"),
        lambda m: m.briefing("claude", "tool", "failed"),
        # Labels that would carry a repository, text or a query.
        lambda m: m.recall("forge.example/acme/api", "ok"),
    ],
)
def test_req21_a_bad_label_value_raises(metrics: Metrics, bad) -> None:
    with pytest.raises(ValueError):
        bad(metrics)
    assert b"harness_memory_" in metrics.exposition()
    # Nothing was recorded by the refused call.
    assert not [
        line
        for line in metrics.exposition().decode().splitlines()
        if line.startswith("harness_memory_") and not line.startswith("#")
    ]


@pytest.mark.req21
def test_req21_the_harness_label_is_capped(metrics: Metrics) -> None:
    for name in ("a", "b", "c", "d", "e"):
        metrics.briefing(name, "tool", "ok")
    text = metrics.exposition().decode()
    assert sample(text, "harness_memory_briefings_total", harness="c", delivery="tool", outcome="ok") == 1
    assert sample(text, "harness_memory_briefings_total", harness="d", delivery="tool", outcome="ok") is None
    assert (
        sample(text, "harness_memory_briefings_total", harness=OTHER_HARNESS, delivery="tool", outcome="ok")
        == 2
    )


@pytest.mark.req21
def test_req21_a_harness_name_that_is_no_configuration_name_is_counted_as_other(metrics: Metrics) -> None:
    """A run token may be minted for any harness name; its briefings count under _other, and no label
    carries the name's text (a briefing for it used to fail with a traceback)."""
    metrics.briefing("how do I fix the flaky test", "tool", "ok")
    metrics.briefing("m h0 pushed with token [REDACTED]", "tool", "ok")
    metrics.set_briefing_bytes("", 10)
    text = metrics.exposition().decode()
    assert sample(text, "harness_memory_briefings_total", harness=OTHER_HARNESS, delivery="tool", outcome="ok") == 2
    assert "flaky" not in text and "REDACTED" not in text


def test_registries_are_private() -> None:
    one, two = Metrics(), Metrics()
    one.recall("builtin", "ok")
    assert (
        sample(one.exposition().decode(), "harness_memory_recalls_total", provider="builtin", outcome="ok")
        == 1
    )
    assert (
        sample(two.exposition().decode(), "harness_memory_recalls_total", provider="builtin", outcome="ok")
        is None
    )


def test_actor_queue_depth_lives_outside_the_harness_namespace(metrics: Metrics) -> None:
    metrics.set_actor_queue_depth("index", 4)
    assert sample(metrics.exposition().decode(), "memactors_actor_queue_depth", actor="index") == 4


async def test_other_paths_and_methods(base_url: str) -> None:
    async with httpx2.AsyncClient() as client:
        assert (await client.get(base_url + "/")).status_code == 404
        assert (await client.post(base_url + "/metrics", content=b"x")).status_code == 405
        assert (await client.get(base_url + "/metrics?x=1")).status_code == 200
        head = await client.head(base_url + "/metrics")
        assert head.status_code == 200 and head.content == b""


async def test_garbage_request_gets_400_and_server_survives(base_url: str) -> None:
    host, port = base_url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"NONSENSE\r\n\r\n")
        with trio.fail_after(60):
            data = await stream.receive_some(4096)
    assert data.startswith(b"HTTP/1.1 400")
    assert "harness_memory_pending" in await scrape(base_url)
