"""The one-for-one supervisor: `ChildSpec` (how a child starts and restarts), `Supervisor` (restarts with
backoff, incidents within a window, resource exhaustion retried then given up on) and `open_supervisor`."""

from __future__ import annotations

import errno
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal, Protocol

import attrs
import trio
from loguru import logger

from ...errors import ActorStopped, InvalidArgument, MemactorsError, single_leaf
from ._exhaustion import exhaustion_leaf, is_resource_exhaustion
from ._mailbox import Address, Mailbox

Restart = Literal["permanent", "transient", "temporary"]


class SupervisorFailed(MemactorsError):
    """Raised when a supervisor gives up: a child crashed past the restart intensity or broke the kernel's contract."""

    code = "INTERNAL"


class Actor(Protocol):
    """What every actor looks like: a long-running ``run`` that reports its address when ready."""

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None: ...


@attrs.frozen
class ChildSpec:
    """How a supervisor starts and restarts one child.

    ``start`` is an async function called as ``start(task_status=...)`` (usually an actor's bound
    ``run``); it must call ``task_status.started(value)`` once it can serve. When the value is an
    :class:`Address`, the supervisor closes that mailbox to ask the child to stop and when the child
    ends for good, and every restart must report the same address. ``shutdown_grace`` is how long a
    child with a mailbox gets to finish after its mailbox is closed before it is cancelled; a child
    without a mailbox has no way to hear a stop request and is cancelled at once.
    """

    name: str
    start: Callable[..., Awaitable[object]]
    restart: Restart = attrs.field(default="permanent")
    shutdown_grace: float = 5.0

    @restart.validator
    def _check_restart(self, _attribute: attrs.Attribute[Restart], value: str) -> None:
        if value not in ("permanent", "transient", "temporary"):
            raise InvalidArgument("restart must be permanent, transient or temporary", child=self.name, restart=value)


@attrs.define(eq=False)
class _Child:
    """A running child: its spec, the cancel scope of its current incarnation and its address."""

    spec: ChildSpec
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    address: Address[Any] | None = None
    stopping: bool = False
    done: trio.Event = attrs.field(factory=trio.Event)
    #: logic crashes in a row, each within ``settle`` of its restart (one incident)
    burst: int = 0
    #: resource-exhaustion crashes in a row (backoff only, never counted as incidents)
    exhausted: int = 0
    #: trio time of the first of them, and whether the CRITICAL alarm was logged for this spell
    exhausted_since: float | None = None
    alarmed: bool = False
    last_exhaustion: str | None = None
    #: trio time the running incarnation began (None while waiting out a backoff)
    began: float | None = None
    backoff_scope: trio.CancelScope | None = None


class Supervisor:
    """Starts children, restarts them one-for-one, and stops them; made by :func:`open_supervisor`."""

    def __init__(self, nursery: trio.Nursery, name: str, max_restarts: int, window: float, *,
                 backoff: float = 0.1, max_backoff: float = 30.0, settle: float = 1.0,
                 max_burst: int = 8, exhaustion_alarm: float = 300.0, exhaustion_limit: float = 1800.0) -> None:
        self._nursery = nursery
        self.name = name
        self.max_restarts = max_restarts
        self.window = window
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.settle = settle
        self.max_burst = max_burst
        self.exhaustion_alarm = exhaustion_alarm
        self.exhaustion_limit = exhaustion_limit
        self._children: dict[str, _Child] = {}
        self._restarts: deque[float] = deque()
        self._closing = False

    def running(self) -> list[str]:
        """Names of the children currently supervised, in start order."""
        return list(self._children)

    def exhausted(self) -> dict[str, dict[str, Any]]:
        """Children retrying after running out of a resource: {name: {"seconds": how long this spell has
        lasted, "attempts": crashes in it, "error": the last one's type and errno}}."""
        now = trio.current_time()
        return {name: {"seconds": now - child.exhausted_since, "attempts": child.exhausted,
                       "error": child.last_exhaustion}
                for name, child in self._children.items() if child.exhausted_since is not None
                # an incarnation up longer than any backoff has recovered (its next crash starts anew)
                and not (child.began is not None and now - child.began >= self.max_backoff)}

    async def start(self, spec: ChildSpec) -> Any:
        """Start a child and return what it reported with ``task_status.started()``.

        An error the child raises before it is started is raised here and nothing is supervised.
        """
        if self._closing:
            raise ActorStopped("supervisor is stopping", supervisor=self.name, child=spec.name)
        if spec.name in self._children:
            raise InvalidArgument("a child with this name is already running", supervisor=self.name, child=spec.name)
        child = _Child(spec)
        self._children[spec.name] = child
        try:
            return await self._nursery.start(self._supervise, child)
        except BaseException:  # ok: cleanup, then re-raised as is
            self._children.pop(spec.name, None)
            raise

    async def stop(self, name: str) -> None:
        """Stop a child gracefully: close its mailbox, wait up to its grace, then cancel it.

        Returns once the child has ended; does nothing if no child of that name is running.
        """
        child = self._children.get(name)
        if child is None:
            return
        child.stopping = True
        if child.backoff_scope is not None:
            child.backoff_scope.cancel()  # waiting to restart: nothing runs, nothing to finish
        if child.address is None:
            child.scope.cancel()
        else:
            _close(child.address)
            child.scope.deadline = min(child.scope.deadline, trio.current_time() + child.spec.shutdown_grace)
        await child.done.wait()

    async def aclose(self) -> None:
        """Stop every child, latest first, so a child never outlives what it was started after."""
        self._closing = True
        for name in reversed(list(self._children)):
            await self.stop(name)

    async def _supervise(self, child: _Child, *, task_status: trio.TaskStatus[Any]) -> None:
        spec = child.spec
        log = logger.bind(supervisor=self.name, child=spec.name)
        started = False
        try:
            while True:
                error: BaseException | None = None
                broken: SupervisorFailed | None = None
                began = child.began = trio.current_time()
                try:
                    async with trio.open_nursery() as incarnation:
                        child.scope = incarnation.cancel_scope
                        if child.stopping:
                            incarnation.cancel_scope.cancel()
                        value = await incarnation.start(spec.start)
                        if not started:
                            child.address = value if isinstance(value, Address) else None
                            started = True
                            task_status.started(value)
                        elif child.address is not None and value is not child.address:
                            # Senders hold the first address; a new one would strand them.
                            broken = SupervisorFailed(
                                "child reported a new address after a restart; create its mailbox once, outside run()",
                                supervisor=self.name,
                                child=spec.name,
                            )
                            incarnation.cancel_scope.cancel()
                except Exception as exc:
                    error = single_leaf(exc)
                finally:
                    child.began = None
                if broken is not None:
                    raise broken
                if error is not None and not started:
                    # Before started() the error belongs to the caller of start(). Raised outside the
                    # handler so the nursery's exception group does not show up as its context.
                    raise error
                if child.stopping or child.scope.cancelled_caught:
                    log.bind(outcome="stopped").info("child stopped")
                    return
                if error is None and spec.restart != "permanent":
                    log.bind(outcome="returned").info("child finished")
                    return
                if error is not None and spec.restart == "temporary":
                    log.bind(outcome="crashed", error=type(error).__name__).warning("child crashed")
                    return
                delay = self._after_crash(child, error, trio.current_time() - began, log)
                with trio.CancelScope() as child.backoff_scope:
                    await trio.sleep(delay)
                child.backoff_scope = None
                if child.stopping:
                    log.bind(outcome="stopped").info("child stopped")
                    return
        finally:
            if child.address is not None:
                _close(child.address)
            if self._children.get(spec.name) is child:
                del self._children[spec.name]
            child.done.set()

    def _after_crash(self, child: _Child, error: BaseException | None, lived: float, log: Any) -> float:
        """Account for one crash (or return) of ``child``; return the backoff before its restart.

        Raises SupervisorFailed when the child's burst or the supervisor's intensity is exceeded.
        """
        name = child.spec.name
        if error is not None and is_resource_exhaustion(error):
            return self._after_exhaustion(child, error, lived, log)
        child.exhausted, child.exhausted_since, child.alarmed = 0, None, False
        if child.burst > 0 and lived < self.settle:
            child.burst += 1  # crashed again right after its restart: the same incident
            if child.burst > self.max_burst:
                log.bind(crashes=child.burst).error("child keeps crashing right after restarts; supervisor gives up")
                raise SupervisorFailed(
                    f"child {name!r} crashed {child.burst} times in a row, each within {self.settle:g} s of its "
                    "restart; giving up",
                    supervisor=self.name, child=name,
                    last_error=type(error).__name__ if error is not None else "returned",
                ) from error
        else:
            child.burst = 1
            self._count_restart(name, error)
        delay = self._delay(child.burst)
        log.bind(outcome="crashed" if error is not None else "returned",
                 error=type(error).__name__ if error is not None else None, incidents=len(self._restarts),
                 burst=child.burst, retry_in_s=round(delay, 3)).warning("child crashed; restarting after backoff")
        return delay

    def _after_exhaustion(self, child: _Child, error: BaseException, lived: float, log: Any) -> float:
        """Retry a child that ran out of a resource after backoff; alarm, then give up, if it lasts."""
        now = trio.current_time()
        if child.exhausted_since is None or lived >= self.max_backoff:
            # A new spell: the first one, or the child had run longer than any backoff since the last.
            child.exhausted, child.exhausted_since, child.alarmed = 0, now, False
        child.exhausted += 1
        leaf = exhaustion_leaf(error) or error
        code = getattr(leaf, "errno", None)
        child.last_exhaustion = type(leaf).__name__ + (
            f" {errno.errorcode.get(code, code)}" if isinstance(code, int) else "")
        spell = now - child.exhausted_since
        name = child.spec.name
        if spell >= self.exhaustion_limit:
            log.bind(outcome="resource_exhausted", error=child.last_exhaustion, attempts=child.exhausted,
                     seconds=round(spell)).error("child has been out of a resource too long; supervisor gives up")
            raise SupervisorFailed(
                f"child {name!r} has been out of a resource ({child.last_exhaustion}) for {spell:.0f} s"
                f" ({child.exhausted} attempts); giving up after {self.exhaustion_limit:g} s",
                supervisor=self.name, child=name, last_error=child.last_exhaustion,
            ) from error
        delay = self._delay(child.exhausted)
        bound = log.bind(outcome="resource_exhausted", error=child.last_exhaustion, retry_in_s=round(delay, 3),
                         attempt=child.exhausted, seconds=round(spell, 1))
        if spell >= self.exhaustion_alarm and not child.alarmed:
            child.alarmed = True
            bound.bind(gives_up_in_s=round(self.exhaustion_limit - spell)).critical(
                "child has been out of a resource for minutes; free descriptors, memory or disk, or the"
                " supervisor gives up")
        else:
            bound.warning("child ran out of a resource; retrying after backoff (not counted as a crash)")
        return delay

    def _delay(self, attempt: int) -> float:
        factor: float = 2 ** min(attempt - 1, 30)  # int ** int is Any to the checker (a negative power is a float)
        return min(self.backoff * factor, self.max_backoff)

    def _count_restart(self, name: str, error: BaseException | None) -> None:
        """Record one incident now, or raise SupervisorFailed when it would exceed the intensity."""
        now = trio.current_time()
        while self._restarts and self._restarts[0] <= now - self.window:
            self._restarts.popleft()
        if len(self._restarts) >= self.max_restarts:
            logger.bind(supervisor=self.name, child=name, restarts=len(self._restarts)).error(
                "restart intensity exceeded; supervisor gives up"
            )
            raise SupervisorFailed(
                f"child {name!r} failed more than {self.max_restarts} times in {self.window:g} s; giving up",
                supervisor=self.name,
                child=name,
                last_error=type(error).__name__ if error is not None else "returned",
            ) from error
        self._restarts.append(now)


def _close(address: Address[Any]) -> None:
    Mailbox(address._box).close()


@asynccontextmanager
async def open_supervisor(
    name: str = "supervisor", *, max_restarts: int = 3, window: float = 5.0, backoff: float = 0.1,
    max_backoff: float = 30.0, settle: float = 1.0, max_burst: int = 8, exhaustion_alarm: float = 300.0,
    exhaustion_limit: float = 1800.0,
) -> AsyncIterator[Supervisor]:
    """Open a one-for-one supervisor; leaving the block stops its children gracefully.

    Restarts wait ``backoff`` seconds, doubled per crash in a row up to ``max_backoff``. A crash within
    ``settle`` seconds of a restart continues the same incident (at most ``max_burst`` crashes in a row);
    more than ``max_restarts`` incidents within ``window`` seconds make the block raise SupervisorFailed
    naming the child. Resource exhaustion is retried after backoff and never counted as an incident; a
    spell of it logs CRITICAL after ``exhaustion_alarm`` seconds and gives up after ``exhaustion_limit``. A single error out of the block is raised as it is rather than
    inside an exception group, so callers can catch SupervisorFailed directly.
    """
    if max_restarts < 0 or not (window > 0 and math.isfinite(window)):
        raise InvalidArgument("restart intensity needs max_restarts >= 0 and a finite window > 0",
                              supervisor=name, max_restarts=max_restarts, window=window)
    if not (0 <= backoff <= max_backoff and math.isfinite(max_backoff)) or settle < 0 or max_burst < 1:
        raise InvalidArgument("backoff needs 0 <= backoff <= max_backoff (finite), settle >= 0, max_burst >= 1",
                              supervisor=name, backoff=backoff, max_backoff=max_backoff)
    if not 0 < exhaustion_alarm <= exhaustion_limit:
        raise InvalidArgument("resource exhaustion needs 0 < exhaustion_alarm <= exhaustion_limit",
                              supervisor=name, exhaustion_alarm=exhaustion_alarm, exhaustion_limit=exhaustion_limit)
    try:
        async with trio.open_nursery() as nursery:
            supervisor = Supervisor(nursery, name, max_restarts, window, backoff=backoff,
                                    max_backoff=max_backoff, settle=settle, max_burst=max_burst,
                                    exhaustion_alarm=exhaustion_alarm, exhaustion_limit=exhaustion_limit)
            yield supervisor
            await supervisor.aclose()
    except BaseExceptionGroup as group:  # ok: unwrapped at the API edge, never swallowed
        single = single_leaf(group)
        if single is group or isinstance(single, trio.Cancelled):
            raise
        raise single from single.__cause__
