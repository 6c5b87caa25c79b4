"""The run-record size bound, shared by the daemon (which enforces it) and `runs ingest` (which splits
its batches by it and rejects an oversized record by name before sending it).

Standard library only: the CLI imports it without the service, the store or the MCP SDK.
"""

from __future__ import annotations

import json
from typing import Any

#: The largest run record IngestRun / IngestRuns / the embedded API accept, as compact UTF-8 JSON.
MAX_RECORD_BYTES = 1024 * 1024


def record_size(data: Any) -> int:
    """A run record's size as compact UTF-8 JSON (what the size bound counts; a lone surrogate, which
    the redactor strips later, counts its three bytes)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return len(text.encode("utf-8", "surrogatepass"))


def oversize_message(source: str, size: int) -> str:
    """The one wording of a refusal for size, used by the daemon and by `runs ingest`."""
    return f"{source}: run record is {size} bytes; the limit is {MAX_RECORD_BYTES} bytes (1 MiB)"


#: The longest line `store import` reads: a run line carries its stored record (at most
#: MAX_RECORD_BYTES) as a JSON string, where escaping can grow it; a longer line is refused by its
#: number and size without being parsed.
MAX_IMPORT_LINE_BYTES = 4 * MAX_RECORD_BYTES
#: The largest episode body (REQ-5's object as JSON) `store import` takes: an episode this daemon
#: assembles is a few KiB (fields of 256 bytes, 50 paths, a 2,000-character excerpt).
MAX_EPISODE_BODY_BYTES = 256 * 1024
