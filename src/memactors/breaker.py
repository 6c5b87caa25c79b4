"""The provider's circuit breaker, as docs/architecture.md's actor table and docs/contracts.md fix it.

Closed → open after 5 consecutive failures or timeouts; open for 30 s; then exactly one half-open probe
(run under `provider_timeout` by its caller); a failed probe doubles the open time, up to 5 minutes; a
successful one closes the breaker and resets the open time. Time is `trio.current_time()`, so tests run
on MockClock.

`Breaker` is the pure state machine; the provider session consults it before every call and reports
every outcome. It is owned by the provider-session actor's task, so nothing else mutates it.

Two rules keep one provider crash from looking like many failures (docs/contracts.md):

* the session reports a dead connection once: of all calls in flight when a stdio provider dies, only
  the first counts as a failure, the others are reported ``neutral``;
* a new connection whose contract check passed may close an open breaker early: ``probe_now()`` makes
  the next call the half-open probe at once instead of after the open time, so a respawned provider
  is back in service with its first successful call.
"""

from __future__ import annotations

from typing import Literal

import attrs
import trio

State = Literal["closed", "open", "half_open"]
Outcome = Literal["ok", "failure", "timeout", "neutral"]

FAILURE_THRESHOLD = 5
BASE_OPEN_SECONDS = 30.0
MAX_OPEN_SECONDS = 300.0


@attrs.define
class Breaker:
    threshold: int = FAILURE_THRESHOLD
    base_open: float = BASE_OPEN_SECONDS
    max_open: float = MAX_OPEN_SECONDS
    state: State = "closed"
    consecutive_failures: int = 0
    open_for: float = attrs.Factory(lambda self: self.base_open, takes_self=True)
    open_until: float = 0.0
    opened_count: int = 0

    def allow(self) -> bool:
        """May a call go to the provider now? In open state past its time, the caller becomes the probe."""
        if self.state == "closed":
            return True
        if self.state == "open" and trio.current_time() >= self.open_until:
            self.state = "half_open"
            return True
        return False

    def report(self, outcome: Outcome) -> None:
        """Report the outcome of a call that `allow()` admitted."""
        if outcome == "ok":
            self.state = "closed"
            self.consecutive_failures = 0
            self.open_for = self.base_open
            return
        if outcome == "neutral":  # cancelled for a reason of our own (shutdown): no verdict on the provider
            if self.state == "half_open":
                self.state, self.open_until = "open", trio.current_time()
            return
        if self.state == "half_open":
            self.open_for = min(self.open_for * 2, self.max_open)
            self._open()
            return
        self.consecutive_failures += 1
        if self.state == "closed" and self.consecutive_failures >= self.threshold:
            self._open()

    def probe_now(self) -> None:
        """A new provider process passed its contract check: let the next call be the probe now."""
        if self.state == "open":
            self.open_until = min(self.open_until, trio.current_time())

    def _open(self) -> None:
        self.state = "open"
        self.open_until = trio.current_time() + self.open_for
        self.opened_count += 1

    @property
    def is_open(self) -> bool:
        return self.state != "closed"
