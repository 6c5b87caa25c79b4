"""MemoryService's operator RPC control tier: what changes memory or reaches the provider.

The feeds of facts, pull requests, presence and votes; minting and revoking run tokens; Forget (REQ-10);
CheckProvider (REQ-4); Reindex. Each is a `control` method in `rpc/methods.py` (IngestRun(s) and the runs'
StartRun/CancelRun are with the runs, in `daemon_runs`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs

from ..actors.retention import ForgetEpisode
from ..errors import InvalidArgument
from ..store import briefing_cache, facts, iso, presence, pull_requests, run_tokens, votes
from ..store.pending import ForgetOutcome
from ..telemetry import guard_sdk_spans
from .parts import ServiceParts
from .providers import check_target, provider_endpoint, upstream_target

#: The longest a minted run token may live (`token mint --ttl`); a resident's token is re-minted.
MAX_TOKEN_TTL_SECONDS = 366 * 86400


class ControlHandlers(ServiceParts):
    """The operator's changes (the RPC's control tier)."""

    async def add_fact(self, *, scope: str, text: str, confidence: float, status: str = "live",
                       fact_id: str | None = None) -> dict[str, Any]:
        now = self.wall_clock()
        checked = facts.fact_status(status)
        fact = await self.store.write(lambda db: facts.add_fact(
            db, scope=scope, text=text, confidence=confidence, status=checked, now=now, fact_id=fact_id))
        return attrs.asdict(fact)

    async def link_pull_request(self, *, repo: str, branch: str, url: str) -> dict[str, Any]:
        now = self.wall_clock()
        await self.store.write(lambda db: pull_requests.link_pull_request(db, repo=repo, branch=branch, url=url, now=now))
        return {"repo": repo, "branch": branch, "url": url}

    async def report_presence(self, *, harness: str, run_id: str, session_id: str, repo: str,
                              branch: str | None, paths: tuple[str, ...] = (), ttl_seconds: int = 300
                              ) -> dict[str, Any]:
        now = self.wall_clock()
        reported = await self.store.write(lambda db: presence.report_presence(
            db, harness=harness, run_id=run_id, session_id=session_id, repo=repo, branch=branch, paths=paths,
            now=now, ttl_seconds=ttl_seconds))
        return attrs.asdict(reported)

    async def cast_vote(self, *, fact_id: str, run_id: str, harness: str, stance: str) -> dict[str, Any]:
        """Store a vote; it is counted only when the run was never shown the fact (REQ-17)."""
        now = self.wall_clock()
        checked = votes.vote_stance(stance)
        vote = await self.store.write(lambda db: votes.cast_vote(
            db, fact_id=fact_id, run_id=run_id, harness=harness, stance=checked, now=now))
        return attrs.asdict(vote)

    async def mint_run_token(self, *, harness: str, run_id: str, workdir: str = "",
                             ttl_seconds: float | None = None, replace: bool = False) -> dict[str, Any]:
        """Mint the bearer token a run presents to the gateway; with ``ttl_seconds`` it
        expires that long from now (`memactors token mint --ttl`), at most a year.

        ``replace`` rotates: the run's earlier tokens are revoked and its cached briefing dropped in the
        same transaction, so the new token is the only one that works (`memactors install` run again)."""
        if ttl_seconds is not None and (isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float)
                                        or not 0 < ttl_seconds <= MAX_TOKEN_TTL_SECONDS):
            raise InvalidArgument(f"ttl_seconds must be a number of seconds from 1 to {MAX_TOKEN_TTL_SECONDS}",
                                  field="ttl_seconds")
        now = self.wall_clock()
        expires = None if ttl_seconds is None else now + timedelta(seconds=ttl_seconds)

        def mint(db: Any) -> tuple[str, int]:
            revoked = 0
            if replace:
                revoked = run_tokens.revoke_run_tokens(db, harness=harness, run_id=run_id)
                briefing_cache.drop_cached_briefing(db, harness, run_id)
            return run_tokens.mint_run_token(db, harness=harness, run_id=run_id, workdir=workdir, now=now,
                                        expires_at=expires), revoked

        token, revoked = await self.store.write(mint)
        return {"harness": harness, "run_id": run_id, "token": token, "revoked": revoked,
                "expires_at": None if expires is None else iso(expires)}

    async def revoke_run_tokens(self, *, harness: str, run_id: str) -> dict[str, Any]:
        """RevokeRunTokens: every token of the run stops working now (`memactors uninstall`); its cached
        briefing is dropped with them."""

        def revoke(db: Any) -> int:
            briefing_cache.drop_cached_briefing(db, harness, run_id)
            return run_tokens.revoke_run_tokens(db, harness=harness, run_id=run_id)

        return {"harness": harness, "run_id": run_id, "revoked": await self.store.write(revoke)}

    async def forget(self, episode_id: str) -> dict[str, Any]:
        """MemoryService.Forget (REQ-10): tombstone now, then memory_forget for each provider id.

        Answers once the tombstone is committed (recall drops the episode from then on) and one round of
        forgets bounded by provider_timeout has run; what is still pending is retried for 24 hours.
        """
        outcome: ForgetOutcome = await self.retention.address.ask(ForgetEpisode(episode_id, "operator"))
        return attrs.asdict(outcome)

    async def check_provider(self, provider: str | None = None) -> dict[str, Any]:
        """MemoryService.CheckProvider (REQ-4): the seven checks against the configured provider or a global upstream.

        The check has its own MCP connection; for the built-in provider an in-process one over this
        store, whose synthetic episodes land only in the built-in provider's own tables (never in
        episodes or memory_index) and are forgotten before the check returns.
        """
        cfg = self.config
        name = provider or self.provider
        # REQ-18: the check's MCP spans (client and server side) follow the same consent as the session's.
        guard_sdk_spans(lambda: self.config.telemetry.export_all)
        upstream = None
        if name == "builtin":
            target: Any = self.builtin.server()
        else:
            upstream = cfg.mcp.get(name)
            if upstream is None or upstream.origin == "project":
                raise InvalidArgument(f"--provider {name}: no [mcp.{name}] in the global file or a drop-in",
                                      field="provider")
            target = upstream_target(upstream)
        report = await check_target(target, provider=name, provider_timeout=cfg.episodes.provider_timeout,
                                    endpoint=provider_endpoint(upstream))
        return {**attrs.asdict(report), "ok": report.ok}

    async def reindex(self, *, everything: bool = False) -> dict[str, Any]:
        """`memactors memory reindex`: wake the background embedder to give every episode without a
        vector its vector (`everything`: retire all vectors first, so every episode is embedded again;
        unchanged texts come back from the cache). Answers the embeddings' status at once; the CLI
        follows it to the end. INVALID_ARGUMENT when embeddings are off."""
        builtin = self.builtin
        if not self.config.memory.is_builtin or not builtin.hybrid:
            raise InvalidArgument("embeddings are off ([memory] embeddings = false, or another provider)",
                                  field="all")
        if everything:
            model = builtin.vector_model
            await self.store.write(lambda db: builtin.index.retire_vectors(db, model, everything=True))
        builtin.wake()
        return await self.embeddings_status() or {}

