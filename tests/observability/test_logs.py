"""Structured logs: key=value text lines, JSON lines, and stdlib logging routed at WARNING+."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from memactors.logs import LogThrottle, configure_logging, get_logger, render_extra


@pytest.fixture
def sink() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    yield buf
    configure_logging()  # back to stderr for whoever runs next


@pytest.mark.errors
def test_a_bound_logger_writes_sorted_key_value_pairs(sink: io.StringIO) -> None:
    configure_logging(sink=sink)
    get_logger(provider="zep", episode="ep_0123456789abcdef0123").bind(bytes=512).info("episode recorded")
    line = sink.getvalue().strip()
    assert line.endswith("INFO    episode recorded bytes=512 episode=ep_0123456789abcdef0123 provider=zep")
    assert line[:4].isdigit()  # starts with the timestamp


def test_values_with_spaces_are_quoted_and_braces_survive(sink: io.StringIO) -> None:
    configure_logging(sink=sink)
    get_logger(error='provider said "no" twice', path="{x}", empty="").warning("upstream failed {0}")
    line = sink.getvalue().strip()
    assert 'error="provider said \\"no\\" twice"' in line
    assert "path={x}" in line
    assert 'empty=""' in line
    assert "upstream failed {0}" in line


def test_render_extra_keeps_private_keys_out() -> None:
    assert render_extra({"b": 2, "a": "x y", "_kv": "hidden"}) == 'a="x y" b=2'
    assert render_extra({"msg": "two\nlines"}) == 'msg="two\\nlines"'


def test_json_mode_yields_parseable_lines_with_extra_fields(sink: io.StringIO) -> None:
    configure_logging(sink=sink, json=True)
    get_logger(actor="index", count=3).info("pruned")
    get_logger(actor="retention").warning("forget retried")
    lines = sink.getvalue().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["record"]["message"] == "pruned"
    assert first["record"]["extra"] == {"actor": "index", "count": 3}
    assert first["record"]["level"]["name"] == "INFO"
    assert json.loads(lines[1])["record"]["extra"] == {"actor": "retention"}


def test_level_filters(sink: io.StringIO) -> None:
    configure_logging("WARNING", sink=sink)
    get_logger().info("quiet")
    get_logger().warning("loud")
    assert "quiet" not in sink.getvalue()
    assert "loud" in sink.getvalue()


def test_stdlib_logging_is_routed_at_warning_and_above(sink: io.StringIO) -> None:
    configure_logging("DEBUG", sink=sink)
    lib = logging.getLogger("hypercorn.error")
    lib.info("chatter that should not print")
    lib.warning("disk %s", "slow")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("mcp.server").info("traceback at info", exc_info=True)
    out = sink.getvalue()
    assert "chatter" not in out
    assert "traceback at info" not in out and "RuntimeError" not in out
    assert "WARNING disk slow stdlib=hypercorn.error" in out


def test_reconfiguring_does_not_duplicate_the_stdlib_bridge(sink: io.StringIO) -> None:
    configure_logging(sink=sink)
    configure_logging(sink=sink)
    logging.getLogger("mcp").error("once")
    assert sink.getvalue().count("once") == 1


def test_tracebacks_do_not_show_local_values(sink: io.StringIO) -> None:
    configure_logging(sink=sink)
    secret_episode_text = "the body of an episode"

    def fail(text: str) -> None:
        raise ValueError(len(text))

    try:
        fail(secret_episode_text)
    except ValueError:
        get_logger(episode="ep_1").exception("summary failed")
    out = sink.getvalue()
    assert "summary failed episode=ep_1" in out
    assert "ValueError" in out
    # With diagnose=True loguru would annotate the frame with the value of `text`.
    assert secret_episode_text not in out


async def test_a_throttle_writes_one_line_per_interval_with_the_count_folded_in(
        autojump_clock: trio.testing.MockClock) -> None:
    throttle = LogThrottle(interval=10.0, max_keys=2)
    assert throttle.allow("degraded TooSlowError") == 0  # the first line is written at once
    assert [throttle.allow("degraded TooSlowError") for _ in range(99)] == [None] * 99
    assert throttle.allow("degraded ProviderUnavailable") == 0  # another key has its own window
    await trio.sleep(9.9)
    assert throttle.allow("degraded TooSlowError") is None
    await trio.sleep(0.2)
    assert throttle.allow("degraded TooSlowError") == 100  # the next line says how many it stands for
    assert throttle.allow("degraded TooSlowError") is None
    throttle.allow("a third key")  # bounded: the oldest key is forgotten
    assert len(throttle._last) == 2
