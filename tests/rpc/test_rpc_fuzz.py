"""No operator RPC frame is answered INTERNAL. Hypothesis draws frames through
``memactors.testing.rpc_fuzz.frame`` (its ``st.randoms`` makes every choice shrinkable) and sends each
over one real websocket to the daemon as a process; every answer must be a well-formed reply whose code
is not INTERNAL. The bench (``bench/rpc_fuzz.py``) runs the same generator over >= 100,000 frames.
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fix_daemon import Daemon, start_daemon
from memactors.rpc.frames import CODES
from memactors.rpc.wsclient import _read_message, _send_frame, handshake
from memactors.testing.rpc_fuzz import frame

pytestmark = pytest.mark.slow


class Connection:
    """One websocket to the daemon, kept across examples (reopened if the daemon closed it)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.sock: socket.socket | None = None

    def open(self) -> socket.socket:
        if self.sock is None:
            url = self.daemon.info["operator"]
            host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
            sock = socket.create_connection((host, int(port)), timeout=60)
            handshake(sock, url, host, int(port), "/harness.v1", self.daemon.token("control"),
                      deadline=time.monotonic() + 60)
            sock.settimeout(60)
            self.sock = sock
        return self.sock

    def ask(self, text: str) -> dict[str, object]:
        sock = self.open()
        _send_frame(sock, 0x1, text.encode("utf-8", "surrogatepass"))
        return json.loads(_read_message(sock))  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


@pytest.fixture(scope="module")
def connection(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Connection]:
    tmp = tmp_path_factory.mktemp("fuzz")
    daemon = start_daemon(tmp, extra_config='[harness.coder]\nharness = "claude-code"\n')
    conn = Connection(daemon)
    try:
        yield conn
    finally:
        conn.close()
        daemon.stop()
        log = daemon.log_text()
        assert "Traceback" not in log, log[-4000:]


@settings(max_examples=2000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
def test_no_fuzzed_rpc_frame_is_answered_internal(connection: Connection, rng: random.Random) -> None:
    text = frame(rng)
    reply = connection.ask(text)
    assert isinstance(reply, dict) and ("result" in reply) != ("error" in reply), reply
    if "error" in reply:
        error = reply["error"]
        assert isinstance(error, dict) and error["code"] in CODES, reply
        assert error["code"] != "INTERNAL", (text[:500], reply)
        assert isinstance(error["message"], str) and error["message"], reply


def test_the_generator_is_seeded_and_covers_every_method() -> None:
    a = [frame(random.Random(5)) for _ in range(3)]
    assert a == [frame(random.Random(5)) for _ in range(3)]
    methods = set()
    rng = random.Random(1)
    for _ in range(3000):
        try:
            doc = json.loads(frame(rng))
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("method"), str):
            methods.add(doc["method"])
    from memactors.testing.rpc_fuzz import METHODS

    assert set(METHODS) <= methods
