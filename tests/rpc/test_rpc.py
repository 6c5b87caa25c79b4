"""Operator RPC transport: tiers, handshake refusal, error mapping, concurrency (real websockets)."""

from __future__ import annotations

import json
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from memactors.errors import ConfigError, PermissionDenied, UnknownEpisode
from memactors.rpc.client import connect_rpc
from memactors.rpc.frames import RpcError
from memactors.rpc.server import Method, serve_rpc
from memactors.rpc.tokens import Tokens, ensure_tokens, read_token

SVC = "harness.v1.MemoryService/"


class Calls:
    """Counts handler invocations by method, so a test can prove a handler never ran."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.slow_entered = trio.Event()

    def seen(self, name: str) -> None:
        self.count[name] = self.count.get(name, 0) + 1


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    return ensure_tokens(tmp_path / "state")


@pytest.fixture
async def url(nursery: trio.Nursery, tokens: Tokens, calls: Calls) -> AsyncIterator[str]:
    async def status(params: dict[str, Any]) -> Any:
        calls.seen("Status")
        return {"provider": "builtin", "echo": params}

    async def forget(params: dict[str, Any]) -> Any:
        calls.seen("Forget")
        return {"forgotten": True}

    async def get_episode(params: dict[str, Any]) -> Any:
        calls.seen("GetEpisode")
        raise UnknownEpisode("no such episode", episode=params.get("id"))

    async def boom(params: dict[str, Any]) -> Any:
        calls.seen("Boom")
        raise RuntimeError("secret episode text that must not leave the daemon")

    async def slow(params: dict[str, Any]) -> Any:
        calls.seen("Slow")
        calls.slow_entered.set()
        await trio.sleep_forever()

    async def fast(params: dict[str, Any]) -> Any:
        calls.seen("Fast")
        return params["n"]

    methods = [
        Method(SVC + "Status", "read", status),
        Method(SVC + "Forget", "control", forget),
        Method(SVC + "GetEpisode", "read", get_episode),
        Method(SVC + "Boom", "read", boom),
        Method(SVC + "Slow", "read", slow),
        Method(SVC + "Fast", "read", fast),
    ]
    host, port = await nursery.start(serve_rpc, methods, "127.0.0.1", 0, tokens)
    yield f"ws://{host}:{port}/harness.v1"


@pytest.mark.req19
@pytest.mark.parametrize("tier", ["read", "control"])
async def test_req19_both_tiers_can_call_a_read_method(url: str, tokens: Tokens, tier: str) -> None:
    async with connect_rpc(url, getattr(tokens, tier)) as client:
        result = await client.call(SVC + "Status", {"x": 1})
    assert result == {"provider": "builtin", "echo": {"x": 1}}


async def _raw_handshake(url: str, extra: str = "") -> bytes:
    """Send a websocket upgrade by hand and return the status code of the answer."""
    hostport, path = url.removeprefix("ws://").split("/", 1)
    host, port = hostport.split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        request = (
            f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            f"{extra}\r\n"
        )
        await stream.send_all(request.encode())
        data = b""
        with trio.fail_after(60):
            while b"\r\n" not in data:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                data += chunk
    return data.split(b"\r\n", 1)[0].split(b" ")[1]


@pytest.mark.req19
async def test_req19_no_token_refuses_the_handshake_and_runs_nothing(url: str, calls: Calls) -> None:
    assert await _raw_handshake(url) == b"401"
    assert await _raw_handshake(url, "Authorization: Basic Zm9vOmJhcg==\r\n") == b"401"
    with pytest.raises(RpcError) as info:
        async with connect_rpc(url, "") as client:
            await client.call(SVC + "Status")
    assert info.value.code == "UNAUTHENTICATED"
    assert calls.count == {}


async def test_a_valid_token_upgrades(url: str, tokens: Tokens) -> None:
    # The raw helper above must be able to see a success, or the 401 assertions prove nothing.
    assert await _raw_handshake(url, f"Authorization: Bearer {tokens.read}\r\n") == b"101"


@pytest.mark.req19
async def test_req19_unknown_token_is_refused(url: str, calls: Calls) -> None:
    with pytest.raises(RpcError) as info:
        async with connect_rpc(url, "not-a-token") as client:
            await client.call(SVC + "Status")
    assert info.value.code == "UNAUTHENTICATED"
    assert calls.count == {}


async def test_wrong_path_is_not_found(url: str, tokens: Tokens) -> None:
    with pytest.raises(RpcError) as info:
        async with connect_rpc(url.replace("/harness.v1", "/other"), tokens.control):
            pass
    assert info.value.code == "NOT_FOUND"


async def test_unreachable_daemon_is_unavailable() -> None:
    # Bind and close a socket to find a port nothing listens on.
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(RpcError) as info:
        async with connect_rpc(f"ws://127.0.0.1:{port}/harness.v1", "t"):
            pass
    assert info.value.code == "UNAVAILABLE"
    assert "daemon not reachable" in str(info.value)


@pytest.mark.req19
async def test_req19_forget_needs_the_control_tier(url: str, tokens: Tokens, calls: Calls) -> None:
    async with connect_rpc(url, tokens.read) as client:
        with pytest.raises(RpcError) as info:
            await client.call(SVC + "Forget", {"id": "ep_0123"})
    assert info.value.code == "PERMISSION_DENIED"
    assert isinstance(info.value, RpcError) and info.value.code == PermissionDenied.code
    assert "Forget" not in calls.count

    async with connect_rpc(url, tokens.control) as client:
        assert await client.call(SVC + "Forget", {"id": "ep_0123"}) == {"forgotten": True}
    assert calls.count["Forget"] == 1


@pytest.mark.errors
async def test_a_memactors_error_maps_to_its_code(url: str, tokens: Tokens) -> None:
    async with connect_rpc(url, tokens.read) as client:
        with pytest.raises(RpcError) as info:
            await client.call(SVC + "GetEpisode", {"id": "ep_missing"})
    assert info.value.code == "NOT_FOUND"
    assert str(info.value) == "no such episode (episode=ep_missing)"


@pytest.mark.errors
async def test_a_generic_exception_is_internal_and_hides_its_text(url: str, tokens: Tokens) -> None:
    async with connect_rpc(url, tokens.read) as client:
        with pytest.raises(RpcError) as info:
            await client.call(SVC + "Boom")
        assert info.value.code == "INTERNAL"
        assert "secret" not in str(info.value)
        # The connection survives a failed handler.
        assert await client.call(SVC + "Fast", {"n": 7}) == 7


async def test_unknown_method_is_unimplemented(url: str, tokens: Tokens) -> None:
    async with connect_rpc(url, tokens.control) as client:
        with pytest.raises(RpcError) as info:
            await client.call(SVC + "Nope")
    assert info.value.code == "UNIMPLEMENTED"


@pytest.mark.parametrize(
    ("frame", "expected_id"),
    [
        ("{not json", None),
        ("[1, 2]", None),
        (json.dumps({"id": True, "method": SVC + "Status"}), None),
        (json.dumps({"id": 5, "method": SVC + "Status", "params": [1]}), 5),
        (json.dumps({"id": "a", "params": {}}), "a"),
    ],
)
async def test_malformed_frames_are_invalid_argument(
    url: str, tokens: Tokens, calls: Calls, frame: str, expected_id: object
) -> None:
    headers = [(b"Authorization", f"Bearer {tokens.read}".encode())]
    async with open_websocket_url(url, extra_headers=headers) as ws:
        await ws.send_message(frame)
        reply = json.loads(await ws.get_message())
    assert reply["id"] == expected_id
    assert reply["error"]["code"] == "INVALID_ARGUMENT"
    assert calls.count == {}


async def test_a_slow_call_does_not_block_a_fast_one(url: str, tokens: Tokens, calls: Calls) -> None:
    async with connect_rpc(url, tokens.read) as client:
        async with trio.open_nursery() as nursery:
            slow_done = trio.Event()

            async def slow() -> None:
                try:
                    await client.call(SVC + "Slow")
                finally:
                    slow_done.set()

            nursery.start_soon(slow)
            # Wait until the server is really inside the slow handler.
            await calls.slow_entered.wait()
            with trio.fail_after(60):
                results = [await client.call(SVC + "Fast", {"n": i}) for i in range(3)]
            assert results == [0, 1, 2]
            assert not slow_done.is_set()
            nursery.cancel_scope.cancel()


async def test_concurrent_calls_are_matched_by_id(url: str, tokens: Tokens) -> None:
    results: dict[int, int] = {}
    async with connect_rpc(url, tokens.read) as client:

        async def one(i: int) -> None:
            results[i] = await client.call(SVC + "Fast", {"n": i})

        async with trio.open_nursery() as nursery:
            for i in range(40):
                nursery.start_soon(one, i)
    assert results == {i: i for i in range(40)}


async def test_body_exceptions_come_out_unwrapped(url: str, tokens: Tokens) -> None:
    with pytest.raises(KeyError):
        async with connect_rpc(url, tokens.read):
            raise KeyError("x")


def test_token_files_are_private_and_stable(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = ensure_tokens(state)
    for tier in ("read", "control"):
        path = state / f"operator-{tier}.token"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert read_token(state, tier) == getattr(first, tier)
    assert first.read != first.control
    assert len(first.read) >= 40

    # A loosened mode is tightened again; the token is never rewritten.
    (state / "operator-read.token").chmod(0o644)
    second = ensure_tokens(state)
    assert second == first
    assert stat.S_IMODE((state / "operator-read.token").stat().st_mode) == 0o600


def test_tokens_resolve_tiers_and_hide_in_repr() -> None:
    tokens = Tokens(read="r" * 43, control="c" * 43)
    assert tokens.tier_for(b"r" * 43) == "read"
    assert tokens.tier_for("c" * 43) == "control"
    assert tokens.tier_for(b"x") is None
    assert tokens.tier_for(None) is None
    assert tokens.tier_for(b"") is None
    assert "rrr" not in repr(tokens)


def test_read_token_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="operator-control.token"):
        read_token(tmp_path, "control")


# --- hardening: Origin, rate-limited lines for malformed input ----------------------------------


@pytest.mark.parametrize("origin, status", [
    ("https://evil.example", b"403"),
    ("null", b"403"),
    ("http://127.0.0.1:1", b"403"),  # same host, another port: another origin
])
async def test_a_foreign_browser_origin_is_refused_before_the_token_is_looked_at(
    url: str, tokens: Tokens, origin: str, status: bytes,
) -> None:
    answer = await _raw_handshake(url, f"Origin: {origin}\r\nAuthorization: Bearer {tokens.control}\r\n")
    assert answer == status


async def test_the_daemons_own_origin_and_clients_without_an_origin_are_accepted(url: str, tokens: Tokens) -> None:
    own = "http://" + url.removeprefix("ws://").split("/")[0]
    for extra in (f"Origin: {own}\r\n", f"Origin: {own.replace('127.0.0.1', 'localhost')}\r\n", ""):
        answer = await _raw_handshake(url, f"{extra}Authorization: Bearer {tokens.read}\r\n")
        assert answer == b"101", extra


async def test_ten_thousand_malformed_frames_give_a_handful_of_log_lines(url: str, tokens: Tokens) -> None:
    import io

    from memactors.logs import configure_logging

    sink = io.StringIO()
    configure_logging(sink=sink)
    started = trio.current_time()
    try:
        async with open_websocket_url(url, extra_headers=[(b"authorization", f"Bearer {tokens.read}".encode())]) as ws:
            for i in range(10_000):
                await ws.send_message("{not json" + "x" * (i % 50))
            for _ in range(10_000):
                reply = json.loads(await ws.get_message())
                assert reply["error"]["code"] == "INVALID_ARGUMENT"
    finally:
        configure_logging()
    took = trio.current_time() - started
    lines = [line for line in sink.getvalue().splitlines() if "malformed frame" in line]
    # One line per peer per 10 s window: a quiet machine sends the 10,000 frames within one or two
    # windows, a loaded one (CI saw 7 lines at load 15) within more; never one line per frame.
    assert 1 <= len(lines) <= 2 + took / 10, (len(lines), took)
    assert all(len(line) < 400 for line in sink.getvalue().splitlines())
