"""Structured logging for memactors, on loguru.

The rule (SPEC-0030 "Error Handling Standards"): a log line carries ids, sizes, counts, durations and
outcomes — episode ids, run ids, provider and harness names, byte counts, error types — and NEVER
episode bodies, summaries, provider text, briefing text, queries, prompts or request params. Put the
facts in bound key-values (``get_logger(actor="index").bind(episode=eid, bytes=n)``), keep the
message a fixed phrase, and log an exception's type rather than its arguments when those could carry
text. Tracebacks are rendered without local variable values (``diagnose=False``) for the same reason.

Text lines look like ``2025-01-02T03:04:05.678+00:00 INFO  rpc call duration_ms=1.2 method=... outcome=ok``:
the bound extras as sorted ``key=value`` pairs, values with spaces or quotes JSON-quoted. With
``json=True`` every line is loguru's serialized record (one JSON object per line, extras under
``record.extra``).

Libraries that log through the stdlib (mcp SDK, hypercorn, trio-websocket) are routed into loguru at
WARNING and above, so their INFO chatter and tracebacks do not reach the operator's terminal.
"""

from __future__ import annotations

import json as _json
import logging
import sys
from typing import TYPE_CHECKING, Any, TextIO

import trio
from loguru import logger

if TYPE_CHECKING:
    from loguru import Logger, Record

__all__ = ["LogThrottle", "configure_logging", "get_logger", "render_extra"]

_TEXT_FORMAT = "{time:YYYY-MM-DDTHH:mm:ss.SSSZ} {level: <7} {message}{extra[_kv]}\n{exception}"


def _render_value(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    if text == "" or any(c.isspace() or c in '"=\\' for c in text):
        return _json.dumps(text, ensure_ascii=False)
    return text


def render_extra(extra: dict[str, Any]) -> str:
    """Render bound key-values as sorted ``key=value`` pairs; keys starting with ``_`` are private."""
    return " ".join(f"{k}={_render_value(v)}" for k, v in sorted(extra.items()) if not k.startswith("_"))


def _text_format(record: Record) -> str:
    kv = render_extra(record["extra"])
    # The rendered pairs go through extra, not into the template, so braces in values stay literal.
    record["extra"]["_kv"] = f" {kv}" if kv else ""
    return _TEXT_FORMAT


class _InterceptHandler(logging.Handler):
    """Forward stdlib ``logging`` records to loguru, keeping level, logger name and exception."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        logger.bind(stdlib=record.name).opt(depth=6, exception=record.exc_info).log(
            level, record.getMessage()
        )


def configure_logging(
    level: str = "INFO",
    *,
    sink: TextIO | Any = sys.stderr,
    json: bool = False,
) -> None:
    """(Re)configure loguru: one sink at ``level``, key=value text or JSON lines, stdlib intercepted.

    Calling it again replaces the previous configuration, so tests and ``memactors serve --log-json``
    can switch formats. ``sink`` is anything loguru accepts (a stream, a path, a callable).
    """
    logger.remove()
    if json:
        logger.add(
            sink, level=level.upper(), serialize=True, format="{message}", backtrace=False, diagnose=False
        )
    else:
        logger.add(sink, level=level.upper(), format=_text_format, backtrace=False, diagnose=False)

    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _InterceptHandler):
            root.removeHandler(handler)
    intercept = _InterceptHandler(level=logging.WARNING)
    root.addHandler(intercept)
    if root.level == logging.NOTSET or root.level < logging.WARNING:
        root.setLevel(logging.WARNING)


def get_logger(**bound: Any) -> Logger:
    """Return the loguru logger with ``bound`` key-values (ids, names, counts only) attached."""
    return logger.bind(**bound)


class LogThrottle:
    """At most one log line per key per ``interval`` seconds of trio time, with the count folded into it.

    For lines that repeat as fast as something outside can make them: a degraded recall (every recall
    while the provider is down), a handler failing the same way, a malformed frame, a refused handshake.
    The first line of a key is written at once; the next ones within ``interval`` are only counted, and
    the first line after it carries ``suppressed=N``::

        suppressed = throttle.allow(f"degraded {error}")
        if suppressed is not None:
            log.bind(suppressed=suppressed).warning("episodes degraded: provider unavailable")

    Time is ``trio.current_time()``, so tests run it on MockClock. Keys are bounded (``max_keys``; the
    oldest is forgotten), so many distinct keys cannot grow it either.
    """

    def __init__(self, interval: float = 10.0, max_keys: int = 1024) -> None:
        self.interval = interval
        self.max_keys = max_keys
        self._last: dict[str, tuple[float, int]] = {}

    def allow(self, key: str) -> int | None:
        """The number of lines suppressed since the last one if a line may be written now, else None."""
        now = trio.current_time()
        last = self._last.get(key)
        if last is not None and 0 <= now - last[0] < self.interval:  # (a clock that went back: expired)
            self._last[key] = (last[0], last[1] + 1)
            return None
        suppressed = last[1] if last is not None else 0
        self._last.pop(key, None)
        if len(self._last) >= self.max_keys:
            self._last.pop(next(iter(self._last)))
        self._last[key] = (now, 0)
        return suppressed
