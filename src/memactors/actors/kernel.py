"""The actor kernel: mailboxes, addresses, ask/tell, deadlines and a one-for-one supervisor.

Every actor in ``memactors.actors`` is built from the few pieces here, the way trio builds its
public API on ``trio._core``.

The model, in plain sentences:

* An actor owns a **mailbox**: a bounded trio memory channel of :class:`Request` objects. Whoever
  holds its :class:`Address` can ``tell`` it a message (fire and forget, but waiting for room in the
  mailbox) or ``ask`` it one and wait for the reply. The buffer is small and explicit, so a slow actor
  pushes back on its senders instead of growing a queue without bound; ``address.statistics()``
  reports how full it is so metrics can export it.
* A request carries a **one-shot reply slot** with room for exactly one answer, so answering never
  waits and can happen in a ``finally`` block while the actor is being cancelled.
* **Deadlines belong to the caller.** ``ask`` never sets one; the caller wraps the call in a cancel
  scope, usually :func:`deadline`, which turns the expiry into :class:`DeadlineExceeded`. A caller that
  gives up marks its reply slot abandoned, and the actor skips the request if it has not started it.
* A **failure in a handler goes back to the requester**: a :class:`MemactorsError` is re-raised as it
  is, anything else as :class:`ActorFailed` chained to the original. The actor keeps serving. Only a
  bug in the actor's own loop crashes it.
* **Nothing waits forever on a stopped actor.** A request in flight when the actor is cancelled is
  answered with :class:`ActorStopped`; when the mailbox is closed, every queued request is answered with
  :class:`ActorStopped` and every later send raises it.
* A mailbox outlives the incarnations of its actor. An actor creates it once (in ``__init__``), reports
  its address with ``task_status.started(address)`` and serves it from ``run()``; a restarted ``run()``
  serves the same mailbox, so senders holding the old address reach the new incarnation, and requests
  still queued at the crash are served by it. Whoever owns the actor's lifetime closes the mailbox: the
  supervisor when the child ends for good, otherwise the code that started it (:meth:`Mailbox.close`).
* A **supervisor** restarts crashed children one-for-one, as Erlang/OTP and triotp do: ``permanent``
  children always, ``transient`` ones only after a crash, ``temporary`` ones never. Every restart waits
  an exponential **backoff** first (``backoff``, doubling per crash in a row, at most ``max_backoff``;
  on ``trio.current_time()``). Crashes are counted as **incidents**: a crash within ``settle`` seconds
  of the previous restart belongs to the same incident, so a burst of instant crashes is one incident
  (given up after ``max_burst`` crashes in a row). More than ``max_restarts`` incidents within
  ``window`` seconds make the supervisor give up with :class:`SupervisorFailed`, naming the child.
  A **resource-exhaustion** error (``EMFILE``, ``ENFILE``, ``ENOMEM``, ``ENOSPC``, ``MemoryError``,
  SQLite's "unable to open" / "database or disk is full") is not a crash of the child's logic: it is
  retried after backoff and never counted as an incident — but not forever. A child that has been out
  of a resource for ``exhaustion_alarm`` seconds (no incarnation in between lived ``max_backoff``)
  is reported once at CRITICAL, and after ``exhaustion_limit`` seconds the supervisor gives up with
  :class:`SupervisorFailed` like any other give-up (the daemon then exits 75 for its service manager).
  Cancellation is never a crash: a cancelled child is not
  restarted and not counted. Stopping a child closes its mailbox (its signal to
  finish the request in hand and return), waits up to its ``shutdown_grace``, then cancels it.
"""

from __future__ import annotations

import errno
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Generic, Literal, Protocol, TypeVar

import attrs
import trio
from loguru import logger

from ..errors import ActorStopped, DeadlineExceeded, InvalidArgument, MemactorsError, find_cause, single_leaf
from ..logs import LogThrottle

#: Codes of errors that answer a requester's mistake; not worth a warning (see rpc.CLIENT_CODES).
_CLIENT_CODES = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "UNAUTHENTICATED",
                           "FAILED_PRECONDITION", "OUT_OF_RANGE"})

__all__ = [
    "Actor",
    "ActorFailed",
    "Address",
    "Ask",
    "ChildSpec",
    "Mailbox",
    "MailboxStatistics",
    "Request",
    "Restart",
    "Supervisor",
    "SupervisorFailed",
    "deadline",
    "is_resource_exhaustion",
    "open_mailbox",
    "open_supervisor",
    "serve",
]

M = TypeVar("M")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

Restart = Literal["permanent", "transient", "temporary"]


class ActorFailed(MemactorsError):
    """Raised to a requester when the actor's handler failed with an error that is not a MemactorsError."""

    code = "INTERNAL"


class SupervisorFailed(MemactorsError):
    """Raised when a supervisor gives up: a child crashed past the restart intensity or broke the kernel's contract."""

    code = "INTERNAL"


@contextmanager
def deadline(seconds: float, what: str, **context: object) -> Iterator[trio.CancelScope]:
    """Run the block under a ``seconds`` deadline and raise DeadlineExceeded(what, **context) on expiry.

    This is ``trio.fail_after`` with a domain error: the deadline stays the caller's cancel scope, and
    the error names what was too slow so a log line or RPC error can say so.
    """
    with trio.move_on_after(seconds) as scope:
        yield scope
    if scope.cancelled_caught:
        raise DeadlineExceeded(f"{what} did not finish within {seconds:g} s", deadline_s=seconds, **context)


class Ask(Generic[R_co]):
    """A base for a message that is answered with an ``R_co``: ``class RecallRequest(Ask[RecallAnswer])``.

    Only for the type checker: ``await address.ask(RecallRequest(...))`` is then a ``RecallAnswer``, as
    trio's ``MemorySendChannel[T]`` carries its item type. It adds no fields and no behaviour (empty
    ``__slots__``), and nothing checks it at run time: the handler's result is the reply, as before.
    """

    __slots__ = ()


@attrs.frozen
class _Reply:
    """The single answer that travels back in a request's reply slot."""

    value: Any = None  # the handler's result: the R of the message's Ask[R]
    error: BaseException | None = None


class _ReplySlot:
    """A request's one-shot reply: room for exactly one answer, and whether the requester still waits.

    (A memory channel per request did the same at about three times the cost: an actor round trip is on
    every ingest and recall several times over.)
    """

    __slots__ = ("answer", "event", "gone")

    def __init__(self) -> None:
        self.answer: _Reply | None = None
        self.event = trio.Event()
        self.gone = False  # the requester stopped waiting (answered, deadline or cancellation)


@attrs.frozen
class Request(Generic[M]):
    """A message in a mailbox, with a one-shot reply slot (``None`` for a ``tell``).

    ``respond`` and ``fail`` are synchronous: the slot has room for exactly one answer, so answering
    never waits. The first answer wins; later ones are ignored and return False.
    """

    message: M
    reply: _ReplySlot | None = None

    @property
    def abandoned(self) -> bool:
        """True when the requester has stopped waiting (deadline or cancellation) for the answer."""
        return self.reply is not None and self.reply.gone

    @property
    def pending(self) -> bool:
        """True while a requester waits for an answer that has not been given."""
        slot = self.reply
        return slot is not None and not slot.gone and slot.answer is None

    def respond(self, value: object = None) -> bool:
        """Send ``value`` to the requester; return whether it was delivered."""
        return self._answer(_Reply(value=value))

    def fail(self, error: BaseException) -> bool:
        """Send ``error`` to the requester, who will see it raised; return whether it was delivered."""
        return self._answer(_Reply(error=error))

    def _answer(self, reply: _Reply) -> bool:
        slot = self.reply
        if slot is None or slot.gone or slot.answer is not None:
            return False  # already answered, or nobody is listening any more
        slot.answer = reply
        slot.event.set()
        return True


@attrs.frozen
class MailboxStatistics:
    """How full a mailbox is, for metrics: queued requests, capacity and senders waiting for room."""

    name: str
    queued: int
    capacity: int
    waiting_senders: int
    closed: bool


@attrs.define(eq=False)
class _Box:
    """The channel pair an Address and its Mailbox share; lives as long as the actor, across restarts."""

    name: str
    send: trio.MemorySendChannel[Request[Any]]
    receive: trio.MemoryReceiveChannel[Request[Any]]
    closed: bool = False

    def stopped(self, what: str) -> ActorStopped:
        return ActorStopped(f"actor stopped {what}", actor=self.name)


class Address(Generic[M]):
    """A handle to send messages to one actor; stable across the actor's restarts."""

    __slots__ = ("_box",)

    def __init__(self, box: _Box) -> None:
        self._box = box

    @property
    def name(self) -> str:
        """The actor's name, as given to :func:`open_mailbox`."""
        return self._box.name

    def __repr__(self) -> str:
        return f"<Address {self._box.name}>"

    async def tell(self, message: M) -> None:
        """Put ``message`` in the mailbox without waiting for it to be handled.

        Waits for room when the mailbox is full (that is the back-pressure). Raises ActorStopped when
        the mailbox is closed.
        """
        await self._put(Request(message))

    async def ask(self, message: Ask[R]) -> R:
        """Send ``message`` and return the actor's answer (an ``R`` for a message of ``Ask[R]``).

        Raises what the handler raised (a MemactorsError as it is, anything else as ActorFailed),
        ActorStopped when the actor is or becomes stopped before answering. Never sets a deadline: wrap
        the call in :func:`deadline` or another cancel scope.
        """
        slot = _ReplySlot()
        try:
            await self._put(Request(message, slot))
            await slot.event.wait()
        finally:
            slot.gone = True  # on the way out, however: the actor sees nobody waits any more
        reply = slot.answer
        if reply is None:
            raise self._box.stopped("without answering")
        if reply.error is None:
            answer: R = reply.value  # what the handler returned for an Ask[R]: an R (not checked at run time)
            return answer
        if isinstance(reply.error, MemactorsError):
            raise reply.error
        raise ActorFailed(
            "actor failed to handle the request",
            actor=self._box.name,
            message_type=type(message).__name__,
            error=type(reply.error).__name__,
        ) from reply.error

    def statistics(self) -> MailboxStatistics:
        """Return how full the actor's mailbox is."""
        stats = self._box.send.statistics()
        return MailboxStatistics(
            name=self._box.name,
            queued=stats.current_buffer_used,
            capacity=int(stats.max_buffer_size),
            waiting_senders=stats.tasks_waiting_send,
            closed=self._box.closed,
        )

    async def _put(self, request: Request[Any]) -> None:
        if self._box.closed:
            raise self._box.stopped("before the message was sent")
        try:
            await self._box.send.send(request)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise self._box.stopped("before the message was sent") from None


class Mailbox(Generic[M]):
    """The receiving side of an actor's address: an async iterator of :class:`Request` objects.

    Iteration ends when the mailbox is closed. Most actors do not iterate it themselves but hand it
    to :func:`serve`.
    """

    __slots__ = ("_box",)

    def __init__(self, box: _Box) -> None:
        self._box = box

    @property
    def name(self) -> str:
        return self._box.name

    @property
    def address(self) -> Address[M]:
        """An address for this mailbox (equivalent to the one :func:`open_mailbox` returned)."""
        return Address(self._box)

    def __repr__(self) -> str:
        return f"<Mailbox {self._box.name}>"

    def __aiter__(self) -> Mailbox[M]:
        return self

    async def __anext__(self) -> Request[M]:
        try:
            return await self._box.receive.receive()
        except (trio.ClosedResourceError, trio.EndOfChannel):
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Stop the mailbox for good: answer queued requests with ActorStopped and refuse new ones.

        Idempotent and synchronous, so it is safe in ``finally``. An iteration or :func:`serve`
        waiting for the next request ends; a request being handled is still answered by its handler.
        """
        box = self._box
        if box.closed:
            return
        box.closed = True
        queued = 0
        while True:  # also takes the messages of senders blocked on a full mailbox
            try:
                request = box.receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            queued += 1
            request.fail(box.stopped("before handling the request"))
        box.receive.close()
        box.send.close()
        logger.bind(actor=box.name, answered_stopped=queued).debug("mailbox closed")


def open_mailbox(name: str, size: int = 16) -> tuple[Address[Any], Mailbox[Any]]:
    """Create an actor's mailbox holding at most ``size`` queued requests; return (address, mailbox)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidArgument("mailbox size must be a non-negative integer", actor=name, size=size)
    send, receive = trio.open_memory_channel[Request[Any]](size)
    box = _Box(name=name, send=send, receive=receive)
    return Address(box), Mailbox(box)


async def serve(
    mailbox: Mailbox[M], handler: Callable[[M], Awaitable[object]], *, concurrency: int = 1,
    context: Callable[[M], Mapping[str, object]] | None = None,
) -> None:
    """Answer every request in ``mailbox`` with ``await handler(message)`` until the mailbox is closed.

    The handler's result is the reply; an exception it raises goes back to the requester and serving
    continues. With ``concurrency`` above 1, up to that many requests are handled at once in a nursery
    owned by this call; the mailbox is not read while all slots are busy, so back-pressure still
    reaches the senders. When the mailbox closes, requests in hand are finished before returning. If
    this call is cancelled, requests in hand are answered with ActorStopped.

    ``context`` names what a failed request was about in its log line (SPEC-0030's error standards: a
    provider error names the provider and the operation): key-values from the message, ids and names
    only, never its content.
    """
    if concurrency < 1:
        raise InvalidArgument("serve concurrency must be at least 1", actor=mailbox.name, concurrency=concurrency)
    # "handler failed" lines: one per (message type, error type, context) per 10 s for this actor.
    failures = LogThrottle(interval=10.0)
    if concurrency == 1:
        async for request in mailbox:
            await _handle(mailbox.name, request, handler, failures, context)
        return
    # `concurrency` long-lived workers, each taking the next request when it is free (a task spawned per
    # request, behind a semaphore, cost a task start and a semaphore round on every message).
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(_worker, mailbox, handler, failures, context)


async def _worker(mailbox: Mailbox[M], handler: Callable[[M], Awaitable[object]], failures: LogThrottle,
                  context: Callable[[M], Mapping[str, object]] | None) -> None:
    async for request in mailbox:
        await _handle(mailbox.name, request, handler, failures, context)


async def _handle(name: str, request: Request[M], handler: Callable[[M], Awaitable[object]],
                  failures: LogThrottle | None = None,
                  context: Callable[[M], Mapping[str, object]] | None = None) -> None:
    """Run the handler for one request and make sure the requester gets exactly one answer."""

    def about() -> Mapping[str, object]:  # read only when a line is written: not on every request
        return context(request.message) if context is not None else {}

    def log() -> Any:
        return logger.bind(actor=name, message_type=type(request.message).__name__, **about())

    if request.abandoned:
        log().debug("request skipped: the requester stopped waiting")
        request.fail(ActorStopped("requester stopped waiting", actor=name))
        return
    try:
        result = await handler(request.message)
    except Exception as exc:
        code = getattr(exc, "code", None) if isinstance(exc, MemactorsError) else None
        if code in _CLIENT_CODES:
            # The requester's mistake (or a missing thing), answered to it; the edge that received
            # the request (RPC, gateway) logs it once with its code.
            log().bind(error=type(exc).__name__, code=code).debug("request refused")
        else:
            # The same failure over and over (every recall while the provider is down) is one line per
            # 10 s with the count folded in, not a line per request (issue 20).
            key = " ".join((type(request.message).__name__, type(exc).__name__, *map(str, about().values())))
            suppressed = failures.allow(key) if failures is not None else 0
            if suppressed is not None:
                log().bind(error=type(exc).__name__, asked=request.reply is not None,
                           suppressed=suppressed).warning("handler failed")
        request.fail(exc)
    else:
        request.respond(result)
    finally:
        # Cancellation (or anything that is not an Exception) must not leave the requester hanging.
        # Nothing to do when the request was answered above (the error is not even built then).
        if request.pending:
            request.fail(ActorStopped("actor stopped while handling the request", actor=name))


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


_EXHAUSTION_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC})
_EXHAUSTION_SQLITE = ("unable to open", "database or disk is full", "out of memory")


def is_resource_exhaustion(exc: BaseException) -> bool:
    """True when ``exc`` (or what it wraps: cause, context, group members) says the machine ran out of
    file descriptors, memory or disk, rather than the code being wrong.

    SQLite errors are recognised by their message, the only place sqlite3/sqlean put the reason.
    """
    return _exhaustion_leaf(exc) is not None


def _exhaustion_leaf(exc: BaseException) -> BaseException | None:
    """The exception in ``exc`` (itself, its cause or context, a group member) that says what ran out."""
    return find_cause(exc, _says_exhausted)


def _says_exhausted(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno in _EXHAUSTION_ERRNOS:
        return True
    return type(exc).__name__ in ("OperationalError", "DatabaseError") and any(
        marker in str(exc).lower() for marker in _EXHAUSTION_SQLITE
    )


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
        leaf = _exhaustion_leaf(error) or error
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
