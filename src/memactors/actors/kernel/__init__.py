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

The package, one concept per module (private: everything is imported from here): ``_mailbox`` (requests,
reply slots, addresses, ask/tell, `deadline`), ``_serve`` (answering a mailbox), ``_supervisor`` (the
one-for-one supervisor) and ``_exhaustion`` (which errors mean the machine ran out of something).
"""

from __future__ import annotations

from ._exhaustion import is_resource_exhaustion as is_resource_exhaustion
from ._mailbox import ActorFailed as ActorFailed
from ._mailbox import Address as Address
from ._mailbox import Ask as Ask
from ._mailbox import Mailbox as Mailbox
from ._mailbox import MailboxStatistics as MailboxStatistics
from ._mailbox import Request as Request
from ._mailbox import deadline as deadline
from ._mailbox import open_mailbox as open_mailbox
from ._serve import serve as serve
from ._supervisor import Actor as Actor
from ._supervisor import ChildSpec as ChildSpec
from ._supervisor import Restart as Restart
from ._supervisor import Supervisor as Supervisor
from ._supervisor import SupervisorFailed as SupervisorFailed
from ._supervisor import open_supervisor as open_supervisor

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
