"""The console's sign-in sessions and their CSRF tokens.

A session is made when a browser presents an operator token (read or control) on the sign-in form; it
holds the tier that token grants, never the token. The browser keeps only a random session id, in a
cookie that is ``HttpOnly`` (no script reads it) and ``SameSite=Strict`` (no other site's page sends
it). Every state-changing form also carries the session's CSRF token, compared in constant time.
Sessions live in the daemon's memory only: a restart signs everyone out.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

import attrs

__all__ = ["COOKIE", "PRE_COOKIE", "Session", "Sessions", "same_token"]

#: The session cookie's name.
COOKIE = "memactors_console"
#: The sign-in form's own CSRF cookie (before there is a session to hold one).
PRE_COOKIE = "memactors_console_signin"
#: Idle seconds after which a session is gone.
IDLE_SECONDS = 3600.0
#: Seconds after sign-in after which a session is gone however busy.
MAX_AGE_SECONDS = 12 * 3600.0
#: The most sessions held at once; the least recently used goes first past it.
MAX_SESSIONS = 64


def same_token(given: str | None, expected: str) -> bool:
    """Whether ``given`` is ``expected``, compared in constant time; False for none."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())


@attrs.define
class Session:
    sid: str
    tier: str
    csrf: str
    created: float
    seen: float

    @property
    def control(self) -> bool:
        return self.tier == "control"


class Sessions:
    """The signed-in browsers, by session id (bounded, idle and absolute expiry)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, idle: float = IDLE_SECONDS,
                 max_age: float = MAX_AGE_SECONDS, cap: int = MAX_SESSIONS) -> None:
        self._clock = clock
        self._idle = idle
        self._max_age = max_age
        self._cap = cap
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_id)

    def create(self, tier: str) -> Session:
        now = self._clock()
        session = Session(sid=secrets.token_urlsafe(32), tier=tier, csrf=secrets.token_urlsafe(32),
                          created=now, seen=now)
        self._by_id[session.sid] = session
        while len(self._by_id) > self._cap:
            self._by_id.popitem(last=False)
        return session

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        session = self._by_id.get(sid)
        if session is None:
            return None
        now = self._clock()
        if now - session.seen > self._idle or now - session.created > self._max_age:
            del self._by_id[sid]
            return None
        session.seen = now
        self._by_id.move_to_end(sid)
        return session

    def drop(self, sid: str | None) -> None:
        if sid:
            self._by_id.pop(sid, None)
