"""The metrics listener on hypercorn: content negotiation, gzip, keep-alive, health probes, promtool."""

from __future__ import annotations

import gzip
import shutil
from collections.abc import AsyncIterator

import httpx2
import pytest
import trio

from memactors.metrics import Metrics, serve_metrics


@pytest.fixture
def metrics() -> Metrics:
    m = Metrics()
    m.episode_recorded("builtin", "ok")
    m.set_provider_up("builtin", True)
    m.observe_provider_call("builtin", "recall", 0.02)
    m.recall("builtin", "ok")
    m.dropped("builtin", "scope", 2)
    m.text_replaced("builtin", 1)
    m.briefing("api-fixer", "tool", "ok", size_bytes=900)
    m.set_pending("builtin", "record", 1)
    m.set_actor_queue_depth("index", 0)
    return m


class Probe:
    reason: str | None = None

    async def __call__(self) -> str | None:
        return self.reason


@pytest.fixture
def probe() -> Probe:
    return Probe()


@pytest.fixture
async def base_url(nursery: trio.Nursery, metrics: Metrics, probe: Probe) -> AsyncIterator[str]:
    host, port = await nursery.start(lambda task_status: serve_metrics(
        metrics, "127.0.0.1", 0, ready=probe, task_status=task_status))
    yield f"http://{host}:{port}"


@pytest.mark.req21
async def test_metrics_default_to_the_prometheus_text_format(base_url: str) -> None:
    async with httpx2.AsyncClient() as http:
        response = await http.get(base_url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "harness_memory_recalls_total{" in response.text
    assert "# EOF" not in response.text


@pytest.mark.req21
async def test_metrics_negotiate_openmetrics_when_the_scraper_asks(base_url: str) -> None:
    async with httpx2.AsyncClient() as http:
        response = await http.get(base_url + "/metrics", headers={"accept": "application/openmetrics-text"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")


async def _response(stream: trio.SocketStream, buffer: bytearray) -> tuple[bytes, bytes]:
    """Read one HTTP/1.1 response (Content-Length or chunked) from ``stream``; return (head, body)."""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in buffer:
            buffer += await stream.receive_some(65536)
        end = buffer.index(b"\r\n\r\n")
        head = bytes(buffer[:end]).lower()
        del buffer[:end + 4]
        lengths = [line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.startswith(b"content-length:")]
        if lengths:
            while len(buffer) < int(lengths[0]):
                buffer += await stream.receive_some(65536)
            body = bytes(buffer[:int(lengths[0])])
            del buffer[:int(lengths[0])]
            return head, body
        assert b"transfer-encoding: chunked" in head
        body = b""
        while True:
            while b"\r\n" not in buffer:
                buffer += await stream.receive_some(65536)
            size_end = buffer.index(b"\r\n")
            size = int(bytes(buffer[:size_end]).split(b";")[0], 16)
            while len(buffer) < size_end + 2 + size + 2:
                buffer += await stream.receive_some(65536)
            body += bytes(buffer[size_end + 2:size_end + 2 + size])
            del buffer[:size_end + 2 + size + 2]
            if size == 0:
                return head, body


@pytest.mark.req21
async def test_metrics_are_gzipped_when_the_scraper_accepts_it(base_url: str) -> None:
    host, port = base_url.removeprefix("http://").split(":")
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
        head, body = await _response(stream, bytearray())
    assert b"content-encoding: gzip" in head
    assert b"harness_memory_recalls_total" in gzip.decompress(body)


async def test_one_connection_serves_many_scrapes(base_url: str) -> None:
    """Keep-alive: three scrapes on one TCP connection, none of them closing it."""
    host, port = base_url.removeprefix("http://").split(":")
    buffer = bytearray()
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        for _ in range(3):
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            head, body = await _response(stream, buffer)
            assert head.startswith(b"http/1.1 200")
            assert b"connection: close" not in head
            assert b"harness_memory_pending" in body


async def test_healthz_is_liveness_and_readyz_follows_the_provider(base_url: str, probe: Probe) -> None:
    async with httpx2.AsyncClient() as http:
        assert (await http.get(base_url + "/healthz")).status_code == 200
        ready = await http.get(base_url + "/readyz")
        assert (ready.status_code, ready.text) == (200, "ready\n")
        probe.reason = "provider builtin is down"
        not_ready = await http.get(base_url + "/readyz")
        assert (not_ready.status_code, not_ready.text) == (503, "not ready: provider builtin is down\n")
        assert (await http.get(base_url + "/healthz")).status_code == 200  # alive though not ready
        assert (await http.get(base_url + "/nope")).status_code == 404


@pytest.mark.req21
async def test_the_exposition_passes_promtool_check_metrics(base_url: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make test` installs Debian's prometheus package; "
                    "or run `apt-get install -y prometheus`")
    async with httpx2.AsyncClient() as http:
        text = (await http.get(base_url + "/metrics")).content
    checked = await trio.run_process([promtool, "check", "metrics"], stdin=text, capture_stdout=True,
                                     capture_stderr=True, check=False)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()

