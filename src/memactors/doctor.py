"""`memactors doctor`: REQ-19's memory rows and REQ-18's privacy note, from MemoryService state.

Each row has a status (pass, info, note, warn, fail), a name and a message. The rows are computed
from data only (`doctor_rows` is pure), so they are tested without a daemon.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import attrs

from .config import Config
from .urls import mask_url

Status = Literal["pass", "info", "note", "warn", "fail"]

UNREACHABLE_FAIL_SECONDS = 300.0
PENDING_WARN_SECONDS = 3600.0
DEGRADED_WINDOW_SECONDS = 86400.0


@attrs.frozen
class Row:
    status: Status
    name: str
    message: str


def doctor_rows(
    config: Config,
    status: Mapping[str, Any],
    *,
    oldest_pending_seconds: Mapping[str, float],
    degraded_recalls_24h: int,
    episodes_missing_vectors: int,
    embedding_model: str = "",
    missing_vectors_since: str | None = None,
    exhausted: Mapping[str, Mapping[str, Any]] | None = None,
    exhaustion_alarm: float = 300.0,
    exhaustion_limit: float = 1800.0,
    config_state: Mapping[str, Any] | None = None,
    session_start: Mapping[str, Any] | None = None,
) -> list[Row]:
    """The memory rows of `harness doctor` (REQ-19) plus REQ-18's note about where episodes go.

    ``exhausted`` is the supervisor's `exhausted()`: actors restarting after running out of a resource
    (file descriptors, memory, disk). Each warns, and fails once its spell has lasted
    ``exhaustion_alarm`` seconds (when the daemon logs its CRITICAL line); at ``exhaustion_limit`` the
    daemon gives up and exits 75.
    """
    rows: list[Row] = []
    provider = status["provider"]
    state = status["state"]
    contract = status.get("contract")
    down_for = float(status.get("state_for_seconds") or 0.0)
    error = status.get("last_error")
    # ready: pass. connecting (no attempt has failed yet): info. Down — a failed connection attempt, a
    # contract check that failed or timed out — warns with the reason from the first failure on, and
    # fails once it has lasted five minutes (REQ-19). Incompatible fails at once.
    # A ready provider behind an open (or half-open) breaker is not healthy either: every recall comes
    # back without episodes and records are queued, so it warns with what that means.
    first: Status = "pass" if state == "ready" else "info" if state == "connecting" else "warn"
    breaker = status.get("breaker")
    if state == "ready" and breaker not in (None, "closed"):
        first = "warn"
    # The provider's real state (Status's condition): the breaker only when it is ready — a provider
    # that is down never reaches it, so "breaker closed" would be said through any outage.
    condition = status.get("condition")
    if condition is None:
        condition = f"{state}, breaker {breaker}" + (
            f": {error}" if error and state not in ("ready", "incompatible") else "")
    rows.append(Row(first, "memory provider",
                    f"{provider} ({status.get('transport')}), contract {contract if contract is not None else 'unknown'}, "
                    f"state {condition}"
                    + (": recalls are answered without episodes and records are queued until it closes"
                       if first == "warn" and state == "ready" else "")))
    rows.extend(store_rows(status.get("store")))
    if state == "incompatible":
        rows.append(Row("fail", "memory provider compatibility",
                        f"{provider} is incompatible: {error or 'unsupported contract'}"))
    elif state == "down" and down_for > UNREACHABLE_FAIL_SECONDS:
        rows.append(Row("fail", "memory provider reachability",
                        f"{provider} has been unreachable for {int(down_for // 60)} minutes"
                        f"{': ' + error if error else ''}; "
                        "recall is degraded and records are queued, harnesses are unaffected"))
    pending = status.get("pending") or {}
    for kind in ("record", "forget"):
        failed = int(pending.get(f"{kind}_failed", 0))
        if failed:
            rows.append(Row("warn", f"memory {kind}s failed", f"{failed} {kind}s gave up after 24 hours ({kind}_failed)"))
        quarantined = int(pending.get(f"{kind}_quarantined", 0))
        if quarantined:
            rows.append(Row("warn", f"memory {kind}s quarantined",
                            f"{quarantined} {kind}s set aside: their stored episode cannot be read "
                            "(the daemon log's `pending record quarantined` lines name each episode; "
                            "`memactors memory forget <id>` removes one)"))
        age = oldest_pending_seconds.get(kind, 0.0)
        if age > PENDING_WARN_SECONDS:
            count = int(pending.get(f"{kind}s", 0))
            rows.append(Row("warn", f"memory {kind}s pending",
                            f"{count} {kind}s pending, the oldest for {int(age // 3600)} h"))
    for name, spell in sorted((exhausted or {}).items()):
        seconds = float(spell.get("seconds") or 0.0)
        rows.append(Row("fail" if seconds >= exhaustion_alarm else "warn", f"memory actor {name}",
                        f"restarting after running out of a resource ({spell.get('error') or 'unknown'}): "
                        f"{spell.get('attempts', 0)} restarts in {int(seconds)} s; the daemon gives up "
                        f"(exit 75) after {int(exhaustion_limit // 60)} minutes of this"))
    if degraded_recalls_24h:
        in_a_row = int((status.get("recalls") or {}).get("degraded_in_a_row") or 0)
        rows.append(Row("warn", "memory recall degraded",
                        f"{degraded_recalls_24h} recalls were degraded in the last 24 hours"
                        + (f", the last {in_a_row} in a row" if in_a_row > 1 else "")))
    embeddings = status.get("embeddings") or {}
    if embeddings.get("off"):
        fix = (embeddings.get("runtime") or {}).get("install_command")
        rows.append(Row("warn", "memory embeddings",
                        f"{embeddings['off']}: recall is BM25 only"
                        + (f"; install it with `{fix}`, then restart the daemon" if fix else "")))
    model = embedding_model or (config.model_api.embedding_model if config.model_api is not None else "") or ""
    if model and episodes_missing_vectors:
        since = f" since {missing_vectors_since}" if missing_vectors_since else ""
        rows.append(Row("warn", "memory embeddings",
                        f"{episodes_missing_vectors} built-in episodes have no vector for {model}{since}"
                        " (the background embedder fills them in, recall ranks them by their text meanwhile;"
                        " `memactors memory reindex` shows it)"))
    rows.append(privacy_note(config))
    if config_state is not None:
        rows.append(config_row(config_state))
    if session_start and session_start.get("count"):
        rows.append(Row("warn", "resident session start",
                        f"{session_start['count']} resident sessions started without their briefing in the last "
                        f"24 hours ({', '.join(session_start.get('harnesses') or ()) or 'unknown harness'}), the last "
                        f"at {session_start.get('last_at')}: {session_start.get('last_error')} (their SessionStart "
                        "hook could not reach the gateway in time; the sessions were not held up)"))
    briefed = sorted(name for name, h in config.harness.items() if h.memory_briefing)
    rows.append(Row("info", "memory briefing prepend",
                    "harnesses with memory_briefing = true: " + (", ".join(briefed) if briefed else "none")))
    rows += install_doctor_rows(status.get("installs") or (), session_start)
    return rows


def install_doctor_rows(installs: Sequence[Mapping[str, Any]],
                        session_start: Mapping[str, Any] | None = None) -> list[Row]:
    """One row per resident install: when it last got a briefing and recorded a session; a
    warning naming the likely cause for that agent when its sessions stopped arriving (``installs``). When
    the session-start hook of its harness failed to reach the daemon in the last day (``session_start``),
    the warning says so first: the daemon was down (or slow) when its sessions started."""
    rows = []
    down_at_start = set((session_start or {}).get("harnesses") or ()) if (session_start or {}).get("count") else set()
    for i in installs:
        name = f"install {i['agent']} {i['scope']} ({i['harness']})"
        seen = (f"last session recorded {i.get('last_session_at') or 'never'}, last briefing served "
                f"{i.get('last_briefing_at') or 'never'}, last seen at the gateway {i.get('last_connected_at') or 'never'}")
        if i.get("problem"):
            first = (f"sessions of {i['harness']} started while the daemon did not answer (last at "
                     f"{(session_start or {}).get('last_at')}); " if i["harness"] in down_at_start else "")
            rows.append(Row("warn", name, f"{first}{i['problem']} ({seen})"))
        else:
            rows.append(Row("pass", name, f"{i.get('sessions', 0)} sessions recorded; {seen}"))
    return rows


def config_row(state: Mapping[str, Any]) -> Row:
    """The configuration in force: where it was loaded from and when; a warning naming the
    error when the last reload failed, the last good configuration staying in force (REQ-1)."""
    where = state.get("global_path") or "defaults"
    loaded = f"loaded from {where} ({len(state.get('files') or ())} files) at {state.get('loaded_at')}"
    if state.get("error"):
        return Row("warn", "configuration",
                   f"the reload at {state.get('failed_at')} failed: {state['error']}; the configuration {loaded} "
                   "stays in force (fix the file: the daemon reloads it when it changes, or on SIGHUP)")
    return Row("pass", "configuration", f"{loaded}; reloaded on SIGHUP and when a file changes")


#: What a full disk says, in SQLite's and PostgreSQL's words: the only errors the disk-full row is for.
_DISK_FULL = re.compile(r"disk (?:is )?full|no space left|could not extend file|disk quota", re.IGNORECASE)


def store_rows(store: Mapping[str, Any] | None) -> list[Row]:
    """The store's row: pass with where it is (and the bytes free on a local disk) and this daemon's id;
    fail when it cannot write (disk full) or, on PostgreSQL, does not answer.

    On PostgreSQL a refused write is a lost connection that the pools are re-establishing far more often
    than a full disk: the row says ``reconnecting to …`` with the error seen, and speaks of
    space only when the error did."""
    if store is None:
        return []
    who = f", daemon {store['daemon_id']}" if store.get("daemon_id") else ""
    if store.get("damaged"):  # quick_check found a damaged page
        return [Row("fail", "memory store", f"{store.get('error')}{who}; recall is degraded and writes may fail "
                                            "until it is restored")]
    error = store.get("error")
    postgres = store.get("engine") == "postgresql"
    server = str(store.get("where") or "").removeprefix("postgresql ")
    if not store.get("reachable", True):
        # The engine is down or unreachable. Recall and briefings degrade, IngestRun answers
        # UNAVAILABLE and acknowledges nothing, work resumes by itself when it is back.
        again = f", reconnecting to {server}" if postgres else ""
        return [Row("fail", "memory store",
                    f"{store.get('where') or store.get('path')}{who}: unreachable{again} "
                    f"({error or 'no answer'}); ingest answers UNAVAILABLE and recall is degraded "
                    "until it is back")]
    free = store.get("free_bytes")
    shown = "unknown" if free is None else _size(int(free))
    place = store.get("where") if postgres else store.get("path")
    if store.get("writable"):
        space = "" if free is None and postgres else f", {shown} free"
        # With a multi-host URL, which server is the primary this daemon writes to now.
        primary = f", primary {store['primary']}" if postgres and store.get("primary") else ""
        return [Row("pass", "memory store", f"{place} is writable{primary}{space}{who}")]
    if postgres and not (error and _DISK_FULL.search(str(error))):
        return [Row("fail", "memory store",
                    f"{place}{who}: reconnecting to {server} (last error: {error or 'a write was refused'}); "
                    "writes answer UNAVAILABLE until the connection is back, then resume by themselves")]
    where_free = "" if free is None and postgres else f"; {shown} free"
    return [Row("fail", "memory store",
                f"{place} is not writable: {error or 'database or disk is full'}{where_free}; "
                "ingests and records are refused (RESOURCE_EXHAUSTED) until space is freed")]


def _size(n: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n} bytes"


def privacy_note(config: Config) -> Row:
    """REQ-18: where episodes go."""
    upstream = config.provider_upstream
    if upstream is None:
        return Row("note", "memory privacy", "built-in provider: episodes stay on this host")
    if upstream.url is not None:
        try:
            host = urlsplit(upstream.url).hostname
        except ValueError:  # not a URL urllib can split ("http://[bad"): shown whole, credentials masked
            host = None
        host = host or mask_url(upstream.url)
        return Row("note", "memory privacy",
                   f"provider {upstream.name} is an HTTP upstream at {host}: episodes leave this host")
    return Row("note", "memory privacy",
               f"provider {upstream.name} is a stdio process ({upstream.command}): memactors cannot see "
               "whether that process calls a network service")


def format_rows(rows: Sequence[Row]) -> str:
    width = max((len(r.name) for r in rows), default=0)
    return "\n".join(f"{r.status.upper():<5} {r.name:<{width}}  {r.message}" for r in rows)
