"""The utility-model client (ADR-0036), REQ-7 summaries and REQ-11 embeddings, against a real HTTP fake."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from functools import partial

import httpx2
import pytest
import trio

from memactors.modelapi import (
    SUMMARY_DEADLINE,
    BudgetExhausted,
    ModelApiClient,
    ModelApiError,
    ModelApiInvalidAnswer,
    ModelApiSettings,
    SummaryResult,
    UtilityBudget,
    cap_to_tokens,
    estimate_tokens,
    summarize_episode,
)
from memactors.testing.fake_model_api import (
    FakeBehaviour,
    FakeModelApi,
    embedding_for,
    run_fake_model_api,
)

TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
EPISODE = "run 42 in forge.example/acme/api: fixed the flaky ledger test; tests pass."


def redact(text: str) -> str:
    """A stand-in for memactors.redact: replaces GitHub tokens."""
    return re.sub(r"ghp_[A-Za-z0-9]{36}", "[REDACTED]", text)


def settings(fake: FakeModelApi, **overrides: object) -> ModelApiSettings:
    values: dict[str, object] = {
        "base_url": fake.base_url,
        "api_key": "sk-test",
        "utility_model": "utility-small",
        "embedding_model": "embed-small",
    }
    values.update(overrides)
    return ModelApiSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelApi]:
    async with run_fake_model_api(behaviour=FakeBehaviour()) as server:
        yield server


@pytest.fixture
async def client(fake: FakeModelApi) -> AsyncIterator[ModelApiClient]:
    async with ModelApiClient(settings(fake)) as c:
        yield c


# --- REQ-7: episode summaries ---------------------------------------------------------------------


@pytest.mark.req7
async def test_req7_a_summary_is_one_tool_less_json_completion(
    fake: FakeModelApi, client: ModelApiClient
) -> None:
    result = await summarize_episode(client, EPISODE, redact=redact)
    assert result == SummaryResult("Fixed the flaky ledger test.", "ok", "ok")
    [request] = fake.requests
    assert request.path == "/v1/chat/completions"
    assert request.authorization == "Bearer sk-test"
    body = request.body
    assert body["model"] == "utility-small"
    assert body["max_tokens"] == 128
    assert body["response_format"] == {"type": "json_object"}
    assert "tools" not in body and "tool_choice" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][1]["content"] == EPISODE
    assert client.budget.used_today_by("episode_summary") == 1


@pytest.mark.req7
async def test_req7_summary_secret_in_the_answer_is_redacted(
    fake: FakeModelApi, client: ModelApiClient
) -> None:
    fake.behaviour.chat_reply = {"summary": f"Rotated the token {TOKEN} and fixed CI."}
    result = await summarize_episode(client, EPISODE, redact=redact)
    assert result.outcome == "ok"
    assert result.summary == "Rotated the token [REDACTED] and fixed CI."


@pytest.mark.req7
async def test_req7_the_input_is_redacted_again_before_it_leaves(
    fake: FakeModelApi, client: ModelApiClient
) -> None:
    await summarize_episode(client, f"pushed with {TOKEN}", redact=redact)
    sent = fake.requests[0].body["messages"][1]["content"]
    assert TOKEN not in sent
    assert sent == "pushed with [REDACTED]"


@pytest.mark.req7
async def test_req7_an_off_schema_summary_is_discarded(fake: FakeModelApi, client: ModelApiClient) -> None:
    fake.behaviour.chat_reply = {"summary": "x" * 900}
    result = await summarize_episode(client, EPISODE, redact=redact)
    assert result == SummaryResult(None, "fallback", "too_long")


@pytest.mark.req7
async def test_req7_a_summary_of_exactly_280_characters_is_kept(
    fake: FakeModelApi, client: ModelApiClient
) -> None:
    fake.behaviour.chat_reply = {"summary": "y" * 280}
    assert (await summarize_episode(client, EPISODE, redact=redact)).summary == "y" * 280
    fake.behaviour.chat_reply = {"summary": "y" * 281}
    assert (await summarize_episode(client, EPISODE, redact=redact)).summary is None


@pytest.mark.req7
@pytest.mark.parametrize(
    "reply",
    [
        "this is not json",
        '["a list", "not an object"]',
        {"summary": "ok", "confidence": 0.9},
        {"summary": 42},
        {"summary": "   "},
        {"text": "wrong key"},
    ],
    ids=["non_json", "non_object", "extra_key", "non_string", "blank", "wrong_key"],
)
async def test_req7_an_invalid_answer_falls_back_to_none(
    fake: FakeModelApi, client: ModelApiClient, reply: object
) -> None:
    fake.behaviour.chat_reply = reply
    result = await summarize_episode(client, EPISODE, redact=redact)
    assert result == SummaryResult(None, "fallback", "invalid")
    assert len(fake.requests) == 1


@pytest.mark.req7
async def test_req7_a_malformed_envelope_falls_back_to_none(
    fake: FakeModelApi, client: ModelApiClient
) -> None:
    fake.behaviour.chat_raw_response = {"choices": []}
    result = await summarize_episode(client, EPISODE, redact=redact)
    assert result == SummaryResult(None, "fallback", "invalid")


@pytest.mark.req7
async def test_req7_a_failed_summary_falls_back_to_none(fake: FakeModelApi, client: ModelApiClient) -> None:
    fake.behaviour.chat_status = 500
    result = await summarize_episode(client, EPISODE, redact=redact)
    assert result == SummaryResult(None, "fallback", "error")
    assert len(fake.requests) == 1


@pytest.mark.req7
async def test_req7_a_slow_summary_falls_back_after_exactly_the_deadline(
    fake: FakeModelApi, client: ModelApiClient, autojump_clock: trio.testing.MockClock
) -> None:
    fake.behaviour.chat_delay = 60.0
    started = trio.current_time()
    result = await summarize_episode(client, EPISODE, redact=redact)
    assert result == SummaryResult(None, "fallback", "slow")
    assert trio.current_time() - started == pytest.approx(SUMMARY_DEADLINE)
    assert SUMMARY_DEADLINE == 10.0


@pytest.mark.req7
async def test_req7_an_answer_just_inside_the_deadline_is_kept(
    fake: FakeModelApi, client: ModelApiClient, autojump_clock: trio.testing.MockClock
) -> None:
    fake.behaviour.chat_delay = 9.5
    result = await summarize_episode(client, EPISODE, redact=redact)
    assert result.outcome == "ok"


@pytest.mark.req7
async def test_req7_the_callers_cancellation_is_not_swallowed(
    fake: FakeModelApi, client: ModelApiClient, autojump_clock: trio.testing.MockClock
) -> None:
    fake.behaviour.chat_delay = 60.0
    returned: list[SummaryResult] = []
    with trio.move_on_after(1.0) as scope:
        returned.append(await summarize_episode(client, EPISODE, redact=redact))
    assert scope.cancelled_caught
    assert returned == []


@pytest.mark.req7
async def test_req7_no_model_api_means_no_summary_not_no_episode() -> None:
    result = await summarize_episode(None, EPISODE, redact=redact)
    assert result == SummaryResult(None, "fallback", "unconfigured")


@pytest.mark.req7
async def test_req7_no_utility_model_sends_nothing(fake: FakeModelApi) -> None:
    async with ModelApiClient(settings(fake, utility_model=None)) as c:
        result = await summarize_episode(c, EPISODE, redact=redact)
    assert result == SummaryResult(None, "fallback", "unconfigured")
    assert fake.requests == []


@pytest.mark.req7
async def test_req7_the_input_is_capped_at_2000_estimated_tokens(
    fake: FakeModelApi, client: ModelApiClient
) -> None:
    huge = "".join(f"line {i} of a very long transcript\n" for i in range(10_000))
    await summarize_episode(client, huge, redact=redact)
    sent = fake.requests[0].body["messages"][1]["content"]
    assert estimate_tokens(sent) == 2000
    assert huge.startswith(sent)


@pytest.mark.req7
async def test_req7_an_exhausted_daily_ceiling_falls_back_without_a_request(fake: FakeModelApi) -> None:
    async with ModelApiClient(settings(fake, daily_requests=1)) as c:
        first = await summarize_episode(c, EPISODE, redact=redact)
        second = await summarize_episode(c, EPISODE, redact=redact)
    assert first.outcome == "ok"
    assert second == SummaryResult(None, "fallback", "budget_exhausted")
    assert len(fake.requests) == 1


# --- token estimates ------------------------------------------------------------------------------


def test_estimate_tokens_is_characters_over_four_rounded_up() -> None:
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]


def test_cap_to_tokens_keeps_short_text_and_cuts_long_text() -> None:
    assert cap_to_tokens("short", 10) == "short"
    assert cap_to_tokens("abcdefghij", 2) == "abcdefgh"
    assert cap_to_tokens("abc", 0) == ""


# --- ADR-0036 shared budget -----------------------------------------------------------------------


async def test_the_rate_limit_spaces_requests_beyond_the_burst(
    autojump_clock: trio.testing.MockClock,
) -> None:
    budget = UtilityBudget(requests_per_minute=2, daily_requests=100)
    started = trio.current_time()
    await budget.acquire("episode_summary")
    await budget.acquire("episode_summary")
    assert trio.current_time() == started
    await budget.acquire("episode_summary")
    assert trio.current_time() - started == pytest.approx(30.0)


async def test_the_rate_limit_is_shared_by_every_utility_use(
    fake: FakeModelApi, autojump_clock: trio.testing.MockClock
) -> None:
    async with ModelApiClient(settings(fake, requests_per_minute=1)) as c:
        started = trio.current_time()
        await summarize_episode(c, EPISODE, redact=redact)
        await c.embed(["ledger"])
        assert trio.current_time() - started == pytest.approx(60.0)
        assert (c.budget.used_today_by("episode_summary"), c.budget.used_today_by("embeddings")) == (1, 1)


async def test_the_wait_for_a_rate_slot_is_bounded_by_the_callers_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    budget = UtilityBudget(requests_per_minute=1, daily_requests=100)
    await budget.acquire("a")
    with trio.move_on_after(5) as scope:
        await budget.acquire("b")
    assert scope.cancelled_caught
    assert budget.used_today == 1  # the cancelled waiter took nothing


async def test_the_daily_ceiling_raises_and_resets_on_the_next_utc_day(
    autojump_clock: trio.testing.MockClock,
) -> None:
    now = [datetime(2025, 3, 1, 23, 0, tzinfo=UTC)]
    budget = UtilityBudget(requests_per_minute=60, daily_requests=3, now=lambda: now[0])
    for _ in range(3):
        await budget.acquire("episode_summary")
    with pytest.raises(BudgetExhausted) as info:
        await budget.acquire("embeddings")
    assert isinstance(info.value, ModelApiError)
    # 01:30 at UTC+2 is still 23:30 UTC of the same day.
    now[0] = datetime(2025, 3, 2, 1, 30, tzinfo=timezone(timedelta(hours=2)))
    with pytest.raises(BudgetExhausted):
        await budget.acquire("embeddings")
    now[0] = datetime(2025, 3, 2, 0, 0, 1, tzinfo=UTC)
    await budget.acquire("embeddings")
    assert budget.used_today == 1


# --- REQ-11 embeddings ----------------------------------------------------------------------------


@pytest.mark.req11
async def test_req11_embeddings_come_back_one_per_text_in_order(
    fake: FakeModelApi, client: ModelApiClient
) -> None:
    texts = ["ledger flake", "billing retry", "ledger flake fixed"]
    vectors = await client.embed(texts)
    assert vectors == [embedding_for(t, 64) for t in texts]
    [request] = fake.requests
    assert request.path == "/v1/embeddings"
    assert request.body == {"model": "embed-small", "input": texts}
    assert request.authorization == "Bearer sk-test"


@pytest.mark.req11
async def test_req11_no_texts_means_no_request(fake: FakeModelApi, client: ModelApiClient) -> None:
    assert await client.embed([]) == []
    assert fake.requests == []


@pytest.mark.req11
async def test_req11_an_embeddings_503_is_a_model_api_error(
    fake: FakeModelApi, client: ModelApiClient
) -> None:
    fake.behaviour.embed_status = 503
    with pytest.raises(ModelApiError) as info:
        await client.embed(["ledger"])
    assert info.value.context["status"] == 503


@pytest.mark.req11
@pytest.mark.parametrize(
    "answer",
    [
        {"data": [{"index": 0, "embedding": [0.1, 0.2]}]},
        {"data": [{"index": 0, "embedding": [0.1, float("nan")]}, {"index": 1, "embedding": [0.1, 0.2]}]},
        {"data": [{"index": 0, "embedding": [0.1, 0.2]}, {"index": 1, "embedding": [0.1]}]},
        {"data": [{"index": 0, "embedding": [0.1, "x"]}, {"index": 1, "embedding": [0.1, 0.2]}]},
        {"data": [{"index": 0, "embedding": [0.1, 0.2]}, {"index": 0, "embedding": [0.1, 0.2]}]},
        {"data": [{"index": 0, "embedding": []}, {"index": 1, "embedding": []}]},
        {"vectors": []},
    ],
    ids=[
        "wrong_count",
        "non_finite",
        "inconsistent_dims",
        "non_numeric",
        "duplicate_index",
        "empty",
        "no_data",
    ],
)
async def test_req11_malformed_vectors_are_a_model_api_error(
    fake: FakeModelApi, client: ModelApiClient, answer: object
) -> None:
    fake.behaviour.embed_raw_response = answer
    with pytest.raises(ModelApiInvalidAnswer):
        await client.embed(["a", "b"])


@pytest.mark.req11
async def test_req11_vectors_are_ordered_by_their_index(fake: FakeModelApi, client: ModelApiClient) -> None:
    fake.behaviour.embed_raw_response = {
        "data": [{"index": 1, "embedding": [0.0, 1.0]}, {"index": 0, "embedding": [1.0, 0.0]}]
    }
    assert await client.embed(["a", "b"]) == [[1.0, 0.0], [0.0, 1.0]]


@pytest.mark.req11
async def test_req11_no_embedding_model_is_an_error_without_a_request(fake: FakeModelApi) -> None:
    async with ModelApiClient(settings(fake, embedding_model=None)) as c:
        with pytest.raises(ModelApiError):
            await c.embed(["ledger"])
    assert fake.requests == []


async def test_an_unreachable_endpoint_is_a_model_api_error() -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()  # nothing listens there any more
    s = ModelApiSettings(f"http://127.0.0.1:{port}", None, "m", "e")
    async with ModelApiClient(s) as c:
        with pytest.raises(ModelApiError) as info:
            await c.embed(["ledger"])
    assert info.value.context["error"] == "ConnectError"


async def test_no_api_key_sends_no_authorization(fake: FakeModelApi) -> None:
    async with ModelApiClient(settings(fake, api_key=None)) as c:
        await c.embed(["ledger"])
    assert fake.requests[0].authorization is None


# --- the fake itself ------------------------------------------------------------------------------


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def test_the_fakes_bag_of_words_vectors_bring_texts_sharing_words_closer(fake: FakeModelApi) -> None:
    fake.behaviour.embed_mode = "bag_of_words"
    fake.behaviour.embed_dim = 256
    async with ModelApiClient(settings(fake)) as c:
        query, near, far = await c.embed(["ledger flake", "the ledger test flake", "billing retry backoff"])
    assert all(math.isclose(_cosine(v, v), 1.0) for v in (query, near, far))
    assert _cosine(query, near) > _cosine(query, far)


@pytest.mark.slow
async def test_the_fake_runs_standalone_and_prints_its_url() -> None:
    async with trio.open_nursery() as nursery:
        proc: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                [sys.executable, "-m", "memactors.testing.fake_model_api", "--port", "0"],
                stdout=subprocess.PIPE,
                check=False,
            )
        )
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                assert chunk, "the fake exited before printing its URL"
                line += chunk
        url = line.decode().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        async with httpx2.AsyncClient() as http:
            response = await http.post(url + "/v1/embeddings", json={"model": "e", "input": ["a"]})
        assert response.status_code == 200
        assert len(response.json()["data"][0]["embedding"]) == 64
        nursery.cancel_scope.cancel()  # run_process kills the fake


@pytest.mark.req11
async def test_req11_a_wrong_vector_count_is_reported_as_such(
    fake: FakeModelApi, client: ModelApiClient
) -> None:
    fake.behaviour.embed_raw_response = {"data": [{"index": 0, "embedding": [0.1, 0.2]}]}
    with pytest.raises(ModelApiInvalidAnswer) as info:
        await client.embed(["a", "b"])
    assert (info.value.context["expected"], info.value.context["got"]) == (2, 1)
