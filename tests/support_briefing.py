"""Run records that look like real runs, and a reader of briefing documents, for the briefing tests.

A real run leaves a subject line and a few sentences, touches several files, sometimes fails a verify
step; an agent CLI that exits at once leaves nothing at all. The tests count and read what a briefing
shows, never which episodes the provider picked.
"""

from __future__ import annotations

import re
from typing import Any

from support import run_record

REPO = "forge.example/acme/api"

#: (subject and body, files, outcome, reason, verify error classes)
RUNS: tuple[tuple[str, tuple[str, ...], str, str, tuple[str, ...]], ...] = (
    ("Fix rounding of ledger totals when posting multi-currency entries.\n\nThe ledger posted totals "
     "with float arithmetic, so multi-currency entries drifted by a cent after conversion. post_entry "
     "now uses Decimal with banker's rounding, and a regression test covers EUR/JPY pairs. The flaky "
     "test_ledger_balance passed 50 runs in a row afterwards.",
     ("src/ledger/post.py", "src/ledger/currency.py", "tests/test_ledger.py"), "succeeded", "completed", ()),
    ("Add retry with jitter to the webhook dispatcher.\n\nDeliveries failed for good on the first 503 "
     "from a receiver. The dispatcher now retries up to five times with exponential backoff and full "
     "jitter, and records each attempt in the delivery log. Tests simulate a receiver that fails twice.",
     ("src/webhooks/dispatch.py", "src/webhooks/log.py", "tests/test_dispatch.py", "docs/webhooks.md"),
     "succeeded", "completed", ()),
    ("Migrate session storage from pickle to JSON (incomplete).\n\nSessions were pickled into the cache, "
     "which broke on every model change. I switched the serialiser to JSON with a schema version, but "
     "test_session_roundtrip still fails: datetimes come back as strings. The migration script is not "
     "written yet.",
     ("src/auth/session.py", "src/cache/backend.py", "tests/test_session.py"), "failed", "verify_failed",
     ("AssertionError", "TypeError")),
    ("Speed up the invoice export by batching its queries.\n\nThe monthly export issued one query per "
     "line item and took eleven minutes for large tenants. It now loads line items in batches of 500 "
     "with one join, which cut the export to forty seconds; rows are streamed to the CSV writer.",
     ("src/billing/export.py", "src/billing/queries.py"), "succeeded", "completed", ()),
    ("Could not finish the CSV escaping fix.\n\nQuotes inside customer names break the export's CSV. "
     "I started replacing the hand-written writer with csv.writer, but the golden files in "
     "tests/data/exports differ in line endings and I ran out of budget before regenerating them.",
     ("src/billing/csv_out.py", "tests/test_csv_out.py"), "failed", "budget_exceeded", ()),
    ("Document the ledger rounding rule and the TZ requirement of its tests.\n\nAdded a section on "
     "banker's rounding to docs/ledger.md and noted in the README that the ledger tests need TZ=UTC "
     "and a fixed clock, which is why they flaked on developer machines in other time zones.",
     ("docs/ledger.md", "README.md"), "succeeded", "completed", ()),
)


def real_run(i: int, *, harness: str = "api-fixer", day: int = 20, branch: str = "main") -> dict[str, Any]:
    """The i-th of RUNS (cycling) as a run record of `harness` on `branch`, started on 2026-11-<day + i>."""
    text, files, outcome, reason, failures = RUNS[i % len(RUNS)]
    at = f"2026-11-{day + i:02d}T09:05:00Z"
    events = [{"kind": "edit", "session_id": "s1", "at": at, "path": f} for f in files]
    events += [{"kind": "verify", "session_id": "s1", "at": at, "ok": False, "error_class": e} for e in failures]
    return run_record(
        harness=harness, run_id=f"r202611{day + i:02d}T090000-{i:06x}", trace_id=f"4bf92f3577b34da6a3ce929d0e0e{i:04x}",
        started_at=f"2026-11-{day + i:02d}T09:00:00Z", ended_at=f"2026-11-{day + i:02d}T09:12:00Z",
        duration_ms=720000, outcome=outcome, reason=reason, result_text=text, events=events,
        sessions=[{"session_id": "s1", "cwd": "/srv/api", "repo": REPO, "git_branch": branch}])


def empty_run(i: int, *, harness: str = "api-fixer", day: int = 28) -> dict[str, Any]:
    """An agent CLI that exited at once (a refused flag, a missing key): no output, no events."""
    return run_record(
        harness=harness, run_id=f"r202611{day:02d}T10{i:02d}00-dead{i:02x}", trace_id=f"empty-{i}",
        started_at=f"2026-11-{day:02d}T10:{i:02d}:00Z", ended_at=f"2026-11-{day:02d}T10:{i:02d}:01Z",
        duration_ms=900, outcome="failed", reason="exit_nonzero", result_text="", events=[],
        sessions=[{"session_id": "s1", "cwd": "/srv/api", "repo": REPO, "git_branch": "main"}])


#: The one-line provenance of a briefing's episode: run, harness, outcome, age.
COMPACT = re.compile(r"^- episode · run (\S+) · harness (\S+) · outcome (\w+) · age (\d+[mhd])$")


def sections(document: str) -> dict[str, str]:
    """A wrapper document's sections by name: each one's lines, headings excluded."""
    out: dict[str, list[str]] = {}
    current = None
    for line in document.splitlines()[1:-1]:
        if line.startswith("## "):
            current = line[3:].split(" ", 1)[0]
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {name: "\n".join(lines) for name, lines in out.items()}


def episode_blocks(document: str) -> list[tuple[str, str]]:
    """(provenance line, text) of each item of the document's episodes section, read as docs/wrapper.md
    says: the text runs from the line after the opening line up to the closing line with the nonce."""
    nonce = document.split('nonce="', 1)[1].split('"', 1)[0]
    closing = f'\n</item nonce="{nonce}">'
    body = sections(document).get("episodes", "")
    blocks: list[tuple[str, str]] = []
    pos = 0
    while pos < len(body):
        end = body.find("\n", pos)
        line = body[pos:] if end < 0 else body[pos:end]
        pos = len(body) if end < 0 else end + 1
        if not line.startswith("- episode"):
            continue
        opening = body[pos:].split("\n", 1)[0]
        assert opening == '<item untrusted="true">', opening  # episode text is always flagged untrusted
        start = pos + len(opening) + 1
        close = body.index(closing, start - 1)
        blocks.append((line, body[start:close]))
        pos = close + len(closing) + 1
    return blocks
