"""The loopback Anthropic fake speaks the Messages wire format the real CLI reads (checked over HTTP)."""

from __future__ import annotations

import json

import httpx2

from memactors.testing.fake_anthropic import Script, Text, ToolUse, run_fake_anthropic

TOOLS = [{"name": "Bash", "input_schema": {"type": "object"}}]


def sse_events(body: str) -> list[tuple[str, dict[str, object]]]:
    events = []
    for chunk in body.strip().split("\n\n"):
        name, data = chunk.split("\n", 1)
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


async def test_fake_streams_a_scripted_tool_call_then_text_and_records_requests() -> None:
    script = Script((ToolUse("Bash", {"command": "pytest -q"}), Text("done")))
    async with run_fake_anthropic(script) as fake, httpx2.AsyncClient(base_url=fake.base_url) as http:
        first = {"model": "m", "stream": True, "tools": TOOLS, "messages": [{"role": "user", "content": "go"}]}
        streamed = await http.post("/v1/messages?beta=true", json=first)
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = sse_events(streamed.text)
        assert [e for e, _ in events] == ["message_start", "content_block_start", "content_block_delta",
                                          "content_block_delta", "content_block_stop", "message_delta",
                                          "message_stop"]
        assert events[1][1]["content_block"]["name"] == "Bash"  # type: ignore[index]
        partial = "".join(d["delta"]["partial_json"] for e, d in events if e == "content_block_delta")  # type: ignore[index]
        assert json.loads(partial) == {"command": "pytest -q"}
        assert events[5][1]["delta"]["stop_reason"] == "tool_use"  # type: ignore[index]

        second = {**first, "stream": False, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t0", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0", "content": "ok"}]}]}
        plain = (await http.post("/v1/messages", json=second)).json()
        assert (plain["content"], plain["stop_reason"]) == ([{"type": "text", "text": "done"}], "end_turn")

        side = (await http.post("/v1/messages", json={"model": "m", "messages": [
            {"role": "user", "content": "title?"}]})).json()
        assert side["content"][0]["text"] == "ok"  # no tools offered: not a scripted turn
        counted = (await http.post("/v1/messages/count_tokens", json=first)).json()
        assert counted["input_tokens"] > 0
        assert (await http.get("/api/anything")).json() == {}
    assert [r.path for r in fake.requests] == ["/v1/messages", "/v1/messages", "/v1/messages",
                                               "/v1/messages/count_tokens", "/api/anything"]
    assert len(fake.agent_requests()) == 2
    assert fake.requests[0].first_user_text() == "go"
    assert fake.agent_requests()[1].tool_results()[0]["tool_use_id"] == "t0"
