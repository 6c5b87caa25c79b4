"""The index actor: the closed runs, episode copies and index rows it writes, and REQ-9's scope filter.

What is written and read is the store's (``store.run_history``, ``store.episodes``,
``store.memory_index``); this module decides what a `RecordRun` keeps and which provider items survive.

The indexed scope is the only scope memactors trusts. `filter_items` is the single choke point every
read path (recall, briefing, operator recall) sends provider items through: an item survives only if its
id has a live index row for the configured provider whose scope the caller may see, and its provenance
is rebuilt from the daemon's own episode row. Only text and score come from the provider.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import cattrs
import trio

from .._wire import episode_from_dict, episode_to_dict
from ..contract import RecallItem
from ..documents import gist
from ..episode import render_text
from ..models import Episode, RunRecord
from ..store import Db, Store, WallClock, each_in_savepoint, episodes, iso, memory_index, run_history
from ..store.episodes import EpisodePage, EpisodeRow
from .kernel import Ask, open_mailbox, serve

#: REQ-9's drop reasons, exactly (REQ-21's ``reason`` label). An item served with the daemon's own text
#: is not dropped: `Filtered.replaced` counts those.
DROP_REASONS = ("unknown_id", "forgotten", "scope", "invalid")


@attrs.frozen
class Provenance:
    """Who, where and how an episode came to be — only from the daemon's episode row."""

    episode_id: str
    run_id: str
    harness: str
    adapter: str
    model: str
    repo: str
    branch: str
    outcome: str
    started_at: str
    scope: str
    trust_class: str


@attrs.frozen
class KeptItem:
    provider_id: str
    text: str
    score: float | None
    provenance: Provenance
    #: The daemon's stored episode (REQ-5 body), parsed once by the re-check: what a reader judges it by
    #: (a briefing leaves empty runs out) without reading it again.
    episode: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)


@attrs.frozen
class Filtered:
    kept: tuple[KeptItem, ...]
    #: (reason, count), reasons from DROP_REASONS (REQ-9's four)
    dropped: tuple[tuple[str, int], ...]
    #: Kept items served with the daemon's own text of their episode in place of the provider's
    #: (not drawn from it): kept, so not a drop; counted in a series of their own.
    replaced: int = 0


@attrs.frozen
class Stored:
    """What RecordRun wrote: whether the run was new, and the episode it stored (None if none was new)."""

    run_new: bool
    episode_new: bool


def record_run(db: Db, m: RecordRun, now: str, claimer: str = "") -> Stored:
    """`RecordRun`'s writes (in the caller's transaction): the run, kept once (the first record stored for
    it wins), then its episode, when it has one, with a pending record to its provider."""
    if not run_history.store_run(db, m.record, repo=m.repo, branch=m.branch, paths=m.paths, now=now, clean=m.clean):
        return Stored(run_new=False, episode_new=False)
    if m.episode is None or m.text is None:
        return Stored(run_new=True, episode_new=False)
    return Stored(run_new=True, episode_new=episodes.store_episode(
        db, m.episode, provider=m.provider, now=now, due=m.record_after, claimer=claimer))


def record_runs(db: Db, runs: Sequence[RecordRun], now: str, claimer: str = "") -> tuple[Stored | Exception, ...]:
    """Many `record_run`s in the caller's transaction, each in its own savepoint (a failure rolls back
    that run alone and is returned in its place)."""
    return each_in_savepoint(db, runs, lambda db, m: record_run(db, m, now, claimer))


# Ellipses and highlight markers a snippet may add (FTS5 snippet() with "[", "]" and "…"); not words.
_WORD = re.compile(r"[^\W_]+")  # letters and digits: "_" separates, as in FTS5's unicode61 tokenizer
_ESCAPES = re.compile(r"\\(?:u2028|u2029|[nr\\])")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.casefold()))


def _has_word(folded: str, word: str) -> bool:
    """Whether ``word`` (a run of letters and digits, case-folded) is one of ``_words`` of the text whose
    case fold is ``folded``: an occurrence with no letter or digit either side (``[^\\W_]`` is exactly
    ``str.isalnum``). A few substring searches, where ``_words`` splits the whole text: a recall checks
    16 items against bodies of kilobytes."""
    start = folded.find(word)
    end = len(folded)
    while start >= 0:
        after = start + len(word)
        if (start == 0 or not folded[start - 1].isalnum()) and (after == end or not folded[after].isalnum()):
            return True
        start = folded.find(word, start + 1)
    return False


def text_belongs(item_text: str, stored_text: str) -> bool:
    """REQ-9 (a lying provider): whether a provider's item text is drawn from the episode's text.

    The rule: every word of the item text — a run of Unicode letters or digits ("_" separates words,
    as in FTS5's unicode61 tokenizer, so a snippet() cut inside `verify_failures` still passes), compared
    case-folded — occurs in the episode's rendering (`render_text`: every REQ-5 field, the
    result excerpt and the summary; its escaped line breaks count as spaces too). Punctuation,
    whitespace, ellipses ("…", "...") and highlight markers ("[", "]") are not words, so a headline
    built from the episode's fields plus an FTS5 snippet() of its text passes, however it is cut or
    marked. A text carrying any word the episode does not have — another repository's memory — fails.
    An empty item text (no words) passes: it carries nothing.
    """
    words = _words(item_text)
    if not words:
        return True
    stored = _words(stored_text)
    if words <= stored:  # the common case: one pass over the stored text
        return True
    return words <= stored | _words(_ESCAPES.sub(" ", stored_text))


def text_belongs_body(item_text: str, body: str) -> bool:
    """`text_belongs` against the episode's stored body (REQ-5 JSON, the one stored copy).

    The words of the body's JSON (its field names and values, escapes read both ways) hold every word
    of its rendering except a few an escape spells differently (a value with U+2028 renders as
    ``\\u2028``), so an item whose words are all there is drawn from the episode: the common case, one
    pass over the body. Any other item is checked against the rendering itself, rendered from the body,
    exactly as `text_belongs` always did. (The body's words are a slight superset of the rendering's —
    `null`, a nested key — all the episode's own: nothing another repository wrote passes.)
    """
    words = _words(item_text)
    if not words:
        return True
    folded = body.casefold()
    if all(_has_word(folded, w) for w in words):  # the common case, without splitting the whole body
        return True
    in_body = _words(body)
    if words <= in_body or words <= in_body | _words(_ESCAPES.sub(" ", body)):
        return True
    try:
        rendering = render_text(episode_from_dict(json.loads(body)))
    except (ValueError, TypeError, KeyError, cattrs.BaseValidationError):
        return False  # a body that is not an episode (none this daemon wrote) vouches for nothing more
    return text_belongs(item_text, rendering)


#: How wide the daemon's own text of an item is: what the built-in provider serves (builtin.MAX_ITEM_TEXT),
#: so a replaced item fits a briefing's episodes share as the built-in provider's items do.
OWN_TEXT_CHARS = 320


def own_text(body: str, words: Sequence[str] = ()) -> str | None:
    """The daemon's own text of an episode, from its stored body: what an item is served with when the
    provider's text for it is not drawn from it. The episode's gist (`gist.gist`, the one rendering of
    an item every surface shares: the run's own words first, the snippet around the query's `words`,
    then what it touched), so every word of it is the episode's; None for a body that is not an object
    (none this daemon wrote)."""
    try:
        episode = json.loads(body)
    except ValueError:
        return None
    return gist(episode, words, OWN_TEXT_CHARS) if isinstance(episode, dict) else None


def filter_items(db: Db, *, provider: str, items: Sequence[RecallItem], invalid: int,
                 visible_scopes: Iterable[str], limit: int, check_text: bool = True,
                 words: Sequence[str] = ()) -> Filtered:
    """REQ-9: keep only items indexed for `provider`, not forgotten, in a scope the caller may see.

    `invalid` is the count of items the contract layer already dropped for breaking REQ-3's bounds.
    Provenance comes from the episode row; the item's text and score are the provider's. With
    `check_text` (every provider but one configured ``own_text = true``) an item whose text is not drawn
    from the episode it names (`text_belongs`: a claim "recorded by harness release-bot", another
    episode's text swapped in) is served with the daemon's own text of that episode instead, counted
    ``replaced`` (not a drop: the agent still gets the episode the provider found, under memactors'
    provenance, and none of the provider's words, "Provenance cannot be spoofed"); `words` (the recall's
    query words) pick its snippet. ``invalid`` stays REQ-3's bounds.
    """
    visible = set(visible_scopes)
    dropped: Counter[str] = Counter()
    replaced_count = 0
    if invalid:
        dropped["invalid"] += invalid
    kept: list[KeptItem] = []
    seen: set[str] = set()
    rows = memory_index.index_rows(db, provider, [item.id for item in items])
    for item in items:
        row = rows.get(item.id)
        if row is None:
            dropped["unknown_id"] += 1
            continue
        scope, idx_forgotten, eid, run_id, harness, repo, branch, outcome, started_at, body, ep_forgotten, trust = row
        if idx_forgotten or ep_forgotten or body is None:
            dropped["forgotten"] += 1
            continue
        if scope not in visible:
            dropped["scope"] += 1
            continue
        text = item.text
        if check_text and not text_belongs_body(item.text, body):
            own = own_text(body, words)
            if own is None:
                dropped["invalid"] += 1
                continue
            text, replaced = own, True
        else:
            replaced = False
        if eid in seen or len(kept) >= limit:
            continue  # several provider ids of one episode: serve it once
        seen.add(eid)
        if replaced:
            replaced_count += 1
        ep = json.loads(body)
        kept.append(KeptItem(
            provider_id=item.id, text=text, score=item.score,
            provenance=Provenance(
                episode_id=eid, run_id=run_id, harness=harness, adapter=ep.get("adapter", ""),
                model=ep.get("model", ""), repo=repo, branch=branch, outcome=outcome, started_at=started_at,
                scope=scope, trust_class=trust,
            ),
            episode=ep,
        ))
    return Filtered(kept=tuple(kept), dropped=tuple(sorted(dropped.items())), replaced=replaced_count)


def episode_view(row: EpisodeRow) -> dict[str, Any]:
    """The operator's view of one stored episode (GetEpisode / ListEpisodes)."""
    view: dict[str, Any] = {
        "episode_id": row.episode_id, "harness": row.harness, "run_id": row.run_id, "repo": row.repo,
        "branch": row.branch, "scope": row.scope, "outcome": row.outcome, "started_at": row.started_at,
        "recorded_at": row.recorded_at, "forgotten_at": row.forgotten_at,
    }
    if row.episode is not None:
        view["episode"] = episode_to_dict(row.episode)
    if row.text is not None:
        view["text"] = row.text
    if row.index:
        view["index"] = [{"provider": p, "provider_id": pid, "forgotten_at": f} for p, pid, f in row.index]
    return view


def now_iso(clock: WallClock) -> str:
    return iso(clock())


# -- the actor ---------------------------------------------------------------------------------------

@attrs.frozen
class RecordRun:
    """Store a closed run (redacted) and, when assembled, its episode plus a pending record to `provider`.

    One transaction; answers `Stored`. A run already stored is left as it is (first record wins).
    """

    record: RunRecord
    repo: str | None
    branch: str | None
    paths: tuple[str, ...]
    episode: Episode | None
    text: str | None
    provider: str
    clean: bool = False  # the record is already `stored_record`-clean: not redacted again
    #: When the retry loop may first try the pending record (an `iso` time; None: at once). The ingest
    #: path records the episode itself right after the commit, so it sets this past its own attempt:
    #: the loop trying the same row meanwhile would only make one of the two answer "queued" and call
    #: the provider twice. The row is claimed by this daemon until then (`queue`), so no other daemon
    #: sharing the store tries it either; the attempt's outcome ends the claim.
    record_after: str | None = None


@attrs.frozen
class RecordRuns(Ask["tuple[Stored | Exception, ...]"]):
    """Many `RecordRun`s in one write transaction (the ingest path), each inside its own savepoint: one
    that raises rolls back alone. Answers a tuple in the same order, one `Stored` or the exception."""

    runs: tuple[RecordRun, ...]



@attrs.frozen
class IndexIds(Ask[bool]):
    provider: str
    episode_id: str
    ids: tuple[str, ...]


@attrs.frozen
class IndexIdsMany(Ask[bool]):
    """`IndexIds` for many episodes of one provider in one write transaction (an ingest batch's
    record); answers whether any of them queued forgets."""

    provider: str
    episodes: tuple[tuple[str, tuple[str, ...]], ...]


@attrs.frozen
class GetEpisode(Ask[EpisodeRow | None]):
    episode_id: str


@attrs.frozen
class ListEpisodes(Ask[EpisodePage]):
    harness: str | None = None
    repo: str | None = None
    since: str | None = None
    limit: int = 100
    after: str | None = None
    outcome: str | None = None
    paths: tuple[str, ...] = ()
    run_id: str | None = None


class Index:
    """Owns the stored episode copies and index rows; decides scope. Reads run concurrently."""

    def __init__(self, store: Store, *, wall_clock: WallClock) -> None:
        self._store = store
        self._clock = wall_clock
        self.address, self._mailbox = open_mailbox("index", 64)

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self.address)
        await serve(self._mailbox, self._handle, concurrency=8)

    async def _handle(self, message: object) -> object:
        now = now_iso(self._clock)
        match message:
            case RecordRun():
                m = message
                return await self._store.write(lambda db: record_run(db, m, now, self._store.daemon_id))
            case RecordRuns(runs=runs):
                return await self._store.write(lambda db: record_runs(db, runs, now, self._store.daemon_id))
            case IndexIds(provider=provider, episode_id=episode_id, ids=ids):
                return await self._store.write(
                    lambda db: memory_index.add_index_rows(db, provider=provider, episode_id=episode_id, ids=ids,
                                                           scope="", now=now))
            case IndexIdsMany(provider=provider, episodes=many):
                def index_all(db: Db) -> bool:
                    queued = [memory_index.add_index_rows(db, provider=provider, episode_id=episode_id, ids=ids,
                                                          scope="", now=now)
                              for episode_id, ids in many]
                    return any(queued)

                return await self._store.write(index_all)
            case GetEpisode(episode_id=episode_id):
                return await self._store.read(lambda db: episodes.get_episode(db, episode_id))
            case ListEpisodes():
                q = message
                return await self._store.read(lambda db: episodes.list_episodes(
                    db, harness=q.harness, repo=q.repo, since=q.since, limit=q.limit, after=q.after,
                    outcome=q.outcome, paths=q.paths, run_id=q.run_id))
            case _:
                raise TypeError(f"index cannot handle {type(message).__name__}")
