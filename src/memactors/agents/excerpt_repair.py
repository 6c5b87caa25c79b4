"""A start-up repair for episodes whose answer an earlier prompt scrub ate.

An earlier memactors scrubbed every line of a run's *composed* prompt — briefing included — so a
run whose answer repeated a line of its briefing (a recurring job's stable "No new issues.") was
stored with ``result_excerpt`` exactly ``[prompt]``, and every later briefing repeated the loss. At
start the daemon looks for such episodes (live ones; a forgotten episode has no body) and:

* **restores** the answer when the run's event log still holds it: the run's last ``text`` event, when
  it is whole (not cut at the event bound), scrubbed of nothing (no ``[prompt]`` or ``[nonce]`` in it)
  and redacted (events are; redacted again here all the same), cut to ``excerpt_chars``;
* else **marks** it: the excerpt becomes :data:`LOST`, so no briefing presents ``[prompt]`` as what the
  agent said.

Only the stored REQ-5 body changes (what ``memory episodes`` and briefings read); a provider's copy of
the episode keeps its old text until the episode is forgotten. It runs on the store's ``Db`` (both
engines; what it reads and writes is ``store.episodes`` and ``store.agent_runs``); idempotent: a
repaired body no longer matches, so a second start finds nothing.
"""

from __future__ import annotations

import json

from ..redact import redact
from ..store import Db
from ..store.agent_runs import log_text
from ..store.episodes import live_bodies_containing, replace_body
from .run_watch import MAX_EVENT_CHARS, NONCE, PROMPT

__all__ = ["LOST", "repair_prompt_excerpts"]

#: The excerpt of an episode whose answer is gone (its run's log does not hold it either).
LOST = "[answer not kept: an earlier memactors took it for the prompt]"


def _last_words(log: str | None) -> str | None:
    """The run's last `text` event, when it can stand for the answer."""
    texts = []
    for line in (log or "").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("kind") == "text" and isinstance(event.get("text"), str):
            texts.append(event["text"])
    if not texts:
        return None
    last: str = texts[-1].strip()
    if not last or PROMPT in last or NONCE in last or (len(texts[-1]) >= MAX_EVENT_CHARS and last.endswith("…")):
        return None
    return last


def repair_prompt_excerpts(db: Db, *, excerpt_chars: int) -> tuple[int, int]:
    """Repair the stored episodes whose ``result_excerpt`` is exactly ``[prompt]``; returns (restored,
    marked)."""
    restored = marked = 0
    for harness, run_id, body_id, raw in live_bodies_containing(db, '"' + PROMPT + '"'):
        try:
            body = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(body, dict) or body.get("result_excerpt") != PROMPT:
            continue
        words = _last_words(log_text(db, harness, run_id))
        if words is not None:
            body["result_excerpt"] = redact(words)[:excerpt_chars]
            restored += 1
        else:
            body["result_excerpt"] = LOST
            marked += 1
        replace_body(db, body_id, body)
    return restored, marked
