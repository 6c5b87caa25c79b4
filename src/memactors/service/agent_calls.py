"""MemoryService's handlers for agents: what the gateway's MCP tools and a run's spawn call.

A gateway bearer token resolved to the run's view, and REQ-12's recall and REQ-15's briefing for that
view (exposure written, REQ-17). The gateway reaches them through `gateway.GatewayService`, the runs actor's
spawn through `actors.spawn.SpawnPort`.
"""

from __future__ import annotations

from typing import Any

import trio

from ..actors.briefing import BriefingAnswer, BriefingRequest, Delivery, RecallAnswer, RecallRequest
from ..errors import InvalidArgument
from ..store import run_tokens
from ..view import UNATTRIBUTED, View, resolve_view, run_place
from .parts import ServiceParts


class AgentHandlers(ServiceParts):
    """Recall and briefings for a run's view (the agent side: gateway, spawn)."""

    async def caller_view(self, token: str | None) -> View:
        """Resolve a gateway bearer token to the run's view; unattributed without a live one.

        One read hop: the token and its run's place are read together (the gateway's bearer gate calls
        this once per HTTP request and hands the view to the tool handlers)."""
        now = self.wall_clock()

        def read(db: Any) -> tuple[Any, tuple[str, str | None] | None]:
            found = run_tokens.resolve_run_token(db, token or "", now)
            return found, None if found is None else run_place(db, found.harness, found.run_id)

        caller, place = await self.store.read(read)
        if caller is None:
            return UNATTRIBUTED
        self.installs.saw(caller.harness, caller.run_id, now)
        return await resolve_view(self.store, self.config, harness=caller.harness, run_id=caller.run_id,
                                  workdir=caller.workdir or None, place=place)

    async def agent_recall(self, view: View, *, query: str, paths: tuple[str, ...] = (), limit: int = 8,
                           call_id: str | None = None) -> RecallAnswer:
        """REQ-12 recall for a harness's view, exposure written for the facts served (REQ-17)."""
        return await self.briefing.address.ask(RecallRequest(
            view=view, query=query, paths=paths, limit=limit, deadline=trio.current_effective_deadline(),
            call_id=call_id))

    async def agent_briefing(self, view: View, *, delivery: str, refresh: bool = False,
                             call_id: str | None = None, episodes_deadline: float | None = None) -> BriefingAnswer:
        """REQ-15 briefing for a run (tool, resource, prompt or spawn delivery); NotAttributed without one.

        The provider part ends by `episodes_deadline` (trio time) if given, else by the caller's deadline.
        """
        deadline = trio.current_effective_deadline() if episodes_deadline is None else episodes_deadline
        answer = await self.briefing.address.ask(BriefingRequest(
            view=view, delivery=_delivery(delivery), refresh=refresh, deadline=deadline, call_id=call_id))
        if view.exposed_run is not None:
            self.installs.briefed_at(*view.exposed_run, self.wall_clock())
        return answer


def _delivery(delivery: str) -> Delivery:
    """``delivery`` as the briefing actor's Delivery. The gateway's service Protocol passes a plain string,
    so the one place that turns it into the actor's message checks it; an unknown one is a caller's bug,
    named here rather than cached or counted under a surface nobody exports."""
    match delivery:
        case "tool" | "resource" | "prompt" | "preview" | "spawn":
            return delivery
    raise InvalidArgument("delivery must be tool, resource, prompt, preview or spawn", field="delivery",
                          value=delivery)
