"""What the daemon calls before it spawns a harness run (REQ-16, REQ-20, REQ-13, REQ-17).

``await prepare_spawn(memory, harness=..., run_id=..., workdir=..., base_argv=[...])`` returns the argv
to exec. ``memory`` is anything with the few members `SpawnPort` names (``service.MemoryService`` is one). For a prompt one-shot (``prompt``, ``prompt_file``, ``prompt_template`` or
``prompt_template_file``) the last element is the operator's prompt — the file read, the template
rendered — preceded, when ``memory_briefing = true``, by REQ-16's fenced briefing and a blank line. For
a resident harness with ``memory_briefing = true`` the briefing is only computed and cached, so the
briefing tool and resource serve it later (REQ-15); nothing is added to its argv.

Guarantees:

* No spawn waits on the provider longer than ``provider_timeout``: the whole briefing computation runs
  under that deadline, with the provider's share ending a little earlier so a dead provider still
  yields a degraded briefing instead of none (REQ-13).
* If the briefing cannot be computed in time, or the composed argument would pass the platform's
  single-argument limit, the run spawns with its prompt alone, a WARN names harness and run, and
  ``harness_memory_briefings_total{delivery="prompt",outcome="skipped"}`` counts it.
* Exposure rows for the briefing's facts are written before this returns, with no call id (REQ-17);
  if they cannot be written the facts are left out of the prepended briefing.
* The composed prompt is returned in argv only: never logged, stored or sent anywhere. One INFO line
  carries harness, run, sizes and item counts. The configured prompt is never changed (REQ-20).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

import attrs
import trio
from loguru import logger

from ..agents.prompt import SkipReason, plan_prompt_argv, render_template
from ..config import Config, HarnessConfig
from ..errors import InvalidArgument, MemactorsError
from ..metrics import Metrics
from ..store import Store
from ..view import View, resolve_view
from .briefing import Briefing, BriefingAnswer, Delivery, ExposePrompt

__all__ = ["SpawnPlan", "operator_prompt", "prepare_spawn"]

#: Part of provider_timeout kept for the local work after the provider call (capped).
_LOCAL_RESERVE = 0.25


@attrs.frozen
class SpawnPlan:
    """The argv to exec and what happened to the briefing (sizes and counts only, never text).

    ``kind`` is ``one_shot`` or ``resident``; ``composed`` says the briefing was prepended;
    ``skipped`` is REQ-16's skip reason (``briefing_unavailable``, ``argument_limit``) or ``empty``
    when there was nothing to prepend, None when composed or when memory_briefing is off.
    """

    argv: tuple[str, ...]
    kind: Literal["one_shot", "resident"]
    composed: bool
    skipped: SkipReason | None
    briefing_bytes: int
    items: Mapping[str, int]
    exposed: int
    degraded: str | None
    #: The operator's prompt alone (a one-shot's; None for a resident): what a run's scrub keeps out of
    #: what it stores, as opposed to the briefing prepended to it.
    prompt: str | None = None


def _prompt_path(cfg: HarnessConfig, config: Config) -> Path:
    assert cfg.prompt_file is not None
    path = Path(cfg.prompt_file).expanduser()
    if not path.is_absolute() and config.source:
        path = config.source[0].parent / path
    return path


async def operator_prompt(cfg: HarnessConfig, config: Config, event: Mapping[str, str] | None = None) -> str | None:
    """The operator's prompt as the adapter gets it: ``prompt`` verbatim, ``prompt_file`` read, or the
    template rendered (REQ-20's event fence only with untrusted_inline). None for a resident harness."""
    if cfg.prompt is not None:
        return cfg.prompt
    if cfg.prompt_file is not None:
        path = _prompt_path(cfg, config)
        try:
            return await trio.Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"prompt_file cannot be read: {type(exc).__name__}", field="prompt_file",
                                  harness=cfg.name) from None
    if cfg.template_text is not None:
        return render_template(cfg.template_text, event=event, untrusted_inline=cfg.untrusted_inline)
    return None


class SpawnPort(Protocol):
    """What `prepare_spawn` needs of the service, and all it may use: the configuration (a run started by
    the daemon passes its own, with the project file merged), the store (to place the run), the briefing
    handler and actor (the briefing, then its exposure rows) and the metrics it counts on."""

    @property
    def config(self) -> Config: ...

    @property
    def store(self) -> Store: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def briefing(self) -> Briefing: ...

    async def agent_briefing(self, view: View, *, delivery: Delivery, refresh: bool = False,
                             call_id: str | None = None, episodes_deadline: float | None = None) -> BriefingAnswer: ...


async def prepare_spawn(
    service: SpawnPort,
    *,
    harness: str,
    run_id: str,
    workdir: str,
    base_argv: Sequence[str],
    event: Mapping[str, str] | None = None,
) -> SpawnPlan:
    """Prepare a run's argv: compute (or reuse) its briefing and compose a one-shot's prompt (REQ-16).

    Raises InvalidArgument for an unknown harness or an unreadable prompt file / unrenderable
    template (a spawn error, as without memory); never for a provider failure.
    """
    config: Config = service.config
    cfg = config.harness.get(harness)
    if cfg is None:
        raise InvalidArgument(f"unknown harness {harness}", field="harness")
    log = logger.bind(harness=harness, run=run_id)
    prompt = await operator_prompt(cfg, config, event)
    kind: Literal["one_shot", "resident"] = "resident" if prompt is None else "one_shot"
    base = tuple(base_argv)
    if not cfg.memory_briefing:
        return SpawnPlan(base if prompt is None else base + (prompt,), kind, False, None, 0, {}, 0, None, prompt)

    answer: BriefingAnswer | None = None
    view: View | None = None
    timeout = config.episodes.provider_timeout
    started = trio.current_time()
    episodes_deadline = started + max(timeout - min(_LOCAL_RESERVE, timeout / 4), 0.0)
    with trio.move_on_after(timeout):
        try:
            view = await resolve_view(service.store, config, harness=harness, run_id=run_id, workdir=workdir)
            answer = await service.agent_briefing(view, delivery="prompt" if prompt is not None else "spawn",
                                                  episodes_deadline=episodes_deadline)
        except MemactorsError as exc:
            log.bind(error=type(exc).__name__).warning("briefing could not be computed")
            answer = None

    if prompt is None:  # resident: computed and cached for the tool and resource, nothing prepended
        if answer is None:
            log.warning("resident briefing not computed at spawn; it will be at first read")
        return SpawnPlan(base, kind, False, None, 0 if answer is None else answer.nbytes,
                         {} if answer is None else dict(answer.items), 0,
                         None if answer is None else answer.document.degraded)

    plan = plan_prompt_argv(base, prompt, None if answer is None else answer.text)
    exposed = 0
    if plan.composed and answer is not None and view is not None and answer.fact_ids:
        answer = await service.briefing.address.ask(ExposePrompt(answer, view))
        exposed = answer.exposed
        if answer.withheld:
            plan = plan_prompt_argv(base, prompt, answer.text)
    nbytes = 0 if answer is None else answer.nbytes
    items = {} if answer is None else dict(answer.items)
    if plan.composed:
        service.metrics.briefing(harness, "prompt", "ok", nbytes)
        log.bind(bytes=nbytes, prompt_bytes=len(plan.argv[-1].encode("utf-8")), exposed=exposed,
                 **items).info("briefing prepended")
    elif plan.reason == "empty":
        service.metrics.briefing(harness, "prompt", "empty", 0)
        log.info("briefing empty; prompt alone")
    else:
        service.metrics.briefing(harness, "prompt", "skipped")
        log.bind(reason=plan.reason, bytes=nbytes).warning("briefing skipped; spawning with the prompt alone")
    degraded = None if answer is None else answer.document.degraded
    return SpawnPlan(plan.argv, kind, plan.composed, plan.reason, nbytes, items, exposed, degraded, prompt)
