"""Mailboxes and addresses: a bounded channel of requests, each with a one-shot reply slot; `Address.tell`
and `Address.ask` (an `Ask[R]` message is answered with an ``R``), and `deadline`, the caller's bound on
an ask."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import attrs
import trio
from loguru import logger

from ...errors import ActorStopped, DeadlineExceeded, InvalidArgument, MemactorsError

M = TypeVar("M")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class ActorFailed(MemactorsError):
    """Raised to a requester when the actor's handler failed with an error that is not a MemactorsError."""

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
