"""Serving a mailbox: `serve` answers every request with the actor's handler, one at a time or up to
``concurrency`` at once; a handler's error goes back to its requester, and every request gets exactly one
answer, even when the actor is cancelled."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import trio
from loguru import logger

from ...errors import ActorStopped, InvalidArgument, MemactorsError
from ...logs import LogThrottle
from ._mailbox import Mailbox, Request

#: Codes of errors that answer a requester's mistake; not worth a warning (see rpc.CLIENT_CODES).
_CLIENT_CODES = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "UNAUTHENTICATED",
                           "FAILED_PRECONDITION", "OUT_OF_RANGE"})

M = TypeVar("M")


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
            # 10 s with the count folded in, not a line per request.
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
