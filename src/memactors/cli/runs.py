"""Runs: `run` (a supervised one-shot now) and the `runs` group (`runs ingest`); the commands for the runs
the daemon supervises (`run`, `runs list|show|wait|cancel|logs`) live in `supervised`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from . import _backfill, supervised
from . import _core as core
from ._core import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, SERVICE

#: Records per IngestRuns call (the contract allows at most 500).
INGEST_BATCH = 200


def ingest_sources(paths: Sequence[str]) -> Iterator[str]:
    """The files `runs ingest` reads, in order: each file as given, each directory's `*.json` files
    (recursively, sorted), and `-` (stdin) as itself."""
    for name in paths:
        path = Path(name)
        if name != "-" and path.is_dir():
            yield from sorted(str(p) for p in path.rglob("*.json") if p.is_file())
        else:
            yield name


#: Stands for a JSON value nested too deeply to parse (rejected by name like any bad record).
_TOO_DEEP = object()


def split_json_stream(buffer: str, *, final: bool) -> tuple[list[Any], str, list[str]]:
    """Parse the complete JSON values at the front of `buffer` (one record, JSON lines, or records one
    after another). Returns (values, the unparsed rest, rejected fragments); at EOF (`final`) an
    unparseable rest is rejected line by line instead of kept."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    pos = 0
    while True:
        while pos < len(buffer) and buffer[pos].isspace():
            pos += 1
        if pos >= len(buffer):
            return values, "", []
        try:
            value, pos = decoder.raw_decode(buffer, pos)
        except RecursionError:  # nested deeper than Python's parser goes: reject this line, keep going
            end = buffer.find("\n", pos)
            end = len(buffer) if end < 0 else end + 1
            values.append(_TOO_DEEP)
            pos = end
            continue
        except ValueError:
            if not final:
                return values, buffer[pos:], []
            return values, "", [line for line in buffer[pos:].splitlines() if line.strip()]
        values.append(value)


class Progress(core.StatusLine):
    """`runs ingest`'s progress: records answered (of how many, when known) and the counts by outcome."""

    def __init__(self, total: int | None, enabled: bool) -> None:
        super().__init__(enabled)
        self.total, self.done = total, 0

    def line(self, counts: dict[str, int]) -> str:
        tally = " ".join(f"{k} {v}" for k, v in counts.items() if v)
        if self.total:
            return f"{core.bar(self.done, self.total)} {tally}"
        return f"{self.done} records {tally}"

    def update(self, counts: dict[str, int]) -> None:
        self.show(self.line(counts))


def _summary(counts: dict[str, int]) -> str:
    parts = [f"{counts[k]} {k}" for k in ("recorded", "queued", "duplicate", "skipped", "rejected")
             if counts[k] or k != "queued"]
    parts += [f"{v} {k}" for k, v in counts.items() if k not in ("recorded", "queued", "duplicate", "skipped",
                                                                  "rejected") and v]
    return ", ".join(parts)


def _record_problem(record: Any, source: str) -> str | None:
    """Why a parsed record cannot be sent at all (so it is rejected by name, not the whole batch): not
    an object, not sendable as JSON, or over the daemon's size bound (checked here with the daemon's
    own rule and wording, so it never travels)."""
    from .._limits import MAX_RECORD_BYTES, oversize_message, record_size

    if not isinstance(record, dict):
        return "a run record must be a JSON object"
    try:
        json.dumps(record, allow_nan=False)
    except ValueError:
        return "not sendable as JSON: it holds Infinity or NaN"
    except RecursionError:
        return "JSON nested too deeply"
    if (size := record_size(record)) > MAX_RECORD_BYTES:
        return oversize_message(source, size)
    return None


#: What one IngestRuns frame may hold: the daemon's frame limit less room for the envelope
#: (``{"id":…,"method":…,"params":{"records":[…]}}``).
FRAME_BUDGET_HEADROOM = 4096


def _label(source: str) -> str:
    """A source label the wire can carry: a file name with undecodable bytes has them replaced."""
    return source.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def cmd_runs_ingest(args: argparse.Namespace) -> int:
    import codecs
    import signal
    import threading

    import trio

    from ..rpc.client import connect_rpc
    from ..rpc.frames import MAX_MESSAGE_SIZE, RpcError, encode_frame

    config = core.load(args)
    token = core.token_for(config, "control")
    url = core.operator_url(config)
    sources = list(ingest_sources(args.files))
    counts: dict[str, int] = {"recorded": 0, "queued": 0, "duplicate": 0, "skipped": 0, "rejected": 0}
    results: list[dict[str, Any]] = []
    progress = Progress(None if "-" in sources else len(sources), sys.stderr.isatty() and not args.json)
    interrupted = False
    budget = MAX_MESSAGE_SIZE - FRAME_BUDGET_HEADROOM
    #: Why the daemon stopped answering (it went away, or refused the whole call), and how many records
    #: were in the call it never answered.
    failure: BaseException | None = None
    unanswered = 0

    def rejected(source: str, message: str) -> None:
        counts["rejected"] += 1
        results.append({"file": source, "outcome": "rejected", "error": message})
        if not args.json:
            progress.clear()
            print(f"rejected {source}: {message}", file=sys.stderr, flush=True)

    def tally(source: str, result: dict[str, Any]) -> None:
        if result.get("outcome") == "rejected":
            error = result.get("error") or {}
            rejected(source, error.get("message", "") if isinstance(error, dict) else str(error))
            return
        counts[result["outcome"]] = counts.get(result["outcome"], 0) + 1
        results.append({"file": source, **result})

    class Batch:
        """Records waiting to go, kept under both the record count and the frame's byte budget."""

        def __init__(self) -> None:
            self.items: list[tuple[str, Any]] = []
            self.bytes = 0

        def fits(self, size: int) -> bool:
            return len(self.items) < INGEST_BATCH and self.bytes + size + 1 <= budget

    batch = Batch()

    async def add(client: Any, source: str, record: Any) -> None:
        """Queue one record, rejecting it by name when it cannot go; send the batch when it is full."""
        source = _label(source)
        if (problem := _record_problem(record, source)) is not None:
            rejected(source, problem)
            progress.done += 1
            return
        size = len(encode_frame({"record": record, "source": source}).encode("utf-8"))
        if not batch.fits(size):
            await send(client)
        batch.items.append((source, record))
        batch.bytes += size + 1

    async def send(client: Any) -> None:
        nonlocal unanswered
        items, batch.items, batch.bytes = batch.items, [], 0
        if not items:
            return
        unanswered = len(items)
        try:
            answer = await client.call(f"{SERVICE}/IngestRuns",
                                       {"records": [{"record": r, "source": s} for s, r in items]})
        except RpcError as exc:
            if exc.code not in ("UNIMPLEMENTED", "INVALID_ARGUMENT"):
                raise
            # A daemon without the batch RPC, or a batch refused whole (say, one record nested past the
            # frame's depth limit): one IngestRun per record, so each is judged on its own.
            answer = None
        if answer is not None:
            for (source, _), result in zip(items, answer["results"], strict=True):
                tally(source, result)
                progress.done += 1
            unanswered = 0
        else:
            for source, record in items:
                try:
                    tally(source, await client.call(f"{SERVICE}/IngestRun", {"record": record, "source": source}))
                except RpcError as exc:
                    if exc.code not in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"):
                        raise
                    rejected(source, exc.message)
                unanswered -= 1
                progress.done += 1
                progress.update(counts)
        progress.update(counts)

    async def stdin_chunks() -> Any:
        """Yield lists of (label, record-or-None, error) as stdin delivers complete JSON values."""
        stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        buffer, n = "", 0
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        async with stream:
            while True:
                data = await stream.receive_some(1 << 16)
                buffer += decoder.decode(data, final=not data)
                values, buffer, bad = split_json_stream(buffer, final=not data)
                chunk: list[tuple[str, Any, str | None]] = []
                for value in values:
                    n += 1
                    chunk.append((f"stdin:{n}", value, None))
                for _fragment in bad:
                    n += 1
                    chunk.append((f"stdin:{n}", None, "not valid JSON"))
                yield chunk
                if not data:
                    return

    async def read_file(source: str) -> tuple[Any, str | None]:
        try:
            return json.loads(await trio.Path(source).read_text(encoding="utf-8")), None
        except UnicodeDecodeError:
            return None, "not UTF-8 text"
        except OSError as exc:
            return None, exc.strerror or type(exc).__name__
        except RecursionError:
            return None, "JSON nested too deeply"
        except ValueError as exc:
            return None, f"not valid JSON ({exc})"

    async def ingest_all(client: Any) -> None:
        for source in sources:
            if source == "-":
                async for chunk in stdin_chunks():
                    for label, record, error in chunk:
                        if record is _TOO_DEEP or error is not None:
                            rejected(label, error or "JSON nested too deeply")
                            progress.done += 1
                        else:
                            await add(client, label, record)
                    await send(client)  # what arrived is sent now, not at EOF
                continue
            record, error = await read_file(source)
            if error is not None:
                rejected(_label(source), error)
                progress.done += 1
                continue
            await add(client, source, record)
        await send(client)

    async def work() -> None:
        nonlocal failure
        try:
            async with connect_rpc(url, token) as client:
                await ingest_all(client)
        except Exception as exc:  # ok: the daemon went away or refused the call; reported with the counts
            if not isinstance(exc, RpcError) and not core.lost_connection(exc):
                raise
            failure = exc

    async def main() -> None:
        nonlocal interrupted
        if threading.current_thread() is not threading.main_thread():
            await work()  # no signal handling off the main thread (embedded callers, tests)
            return
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                async def on_interrupt() -> None:
                    nonlocal interrupted
                    async for _ in signals:
                        interrupted = True
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(on_interrupt)
                await work()
                nursery.cancel_scope.cancel()

    started = time.monotonic()
    try:
        trio.run(main, restrict_keyboard_interrupt_to_checkpoints=True)
    finally:
        progress.clear()
    seconds = time.monotonic() - started
    if interrupted:
        print(f"memactors: interrupted after {progress.done} record(s): {_summary(counts)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if failure is not None:
        return _stopped(failure, progress, counts, unanswered)
    if args.json:
        core.print_json(results)
        # stdout stays the list of results; the rate, as one JSON object, goes to stderr
        print(json.dumps({"records": progress.done, "seconds": round(seconds, 3),
                          "records_per_s": core.per_second(progress.done, seconds)}), file=sys.stderr)
    else:
        print(f"{progress.done} record(s): {_summary(counts)}")
        print(core.rate_line(progress.done, seconds), file=sys.stderr)
    waited = _backfill.follow(args, quiet=args.json)
    return EXIT_FAILED if counts["rejected"] or waited != EXIT_OK else EXIT_OK


def _stopped(failure: BaseException, progress: Progress, counts: dict[str, int], unanswered: int) -> int:
    """The daemon went away (or refused a whole call) mid-ingest: one line for why, one for where it
    stopped, and the exit status of the code (3 unavailable, 8 out of disk, ...). No traceback. When it
    stopped before anything was sent (no daemon answered the handshake), the one line says so."""
    code = getattr(failure, "code", "UNAVAILABLE")
    reason = str(failure) if getattr(failure, "code", None) else \
        f"the connection to the daemon was lost ({type(failure).__name__})"
    if not progress.done and not unanswered:  # never connected, or lost before the first record: one line
        print(f"memactors: {code}: {reason}; no record was sent", file=sys.stderr)
        return core.exit_for(code)
    print(f"memactors: {code}: {reason}", file=sys.stderr)
    line = f"memactors: stopped after {progress.done} record(s): {_summary(counts)}"
    if unanswered and code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        line += (f"; {unanswered} sent without an answer (they may have been recorded: ingesting them again is "
                 "safe, a recorded run answers duplicate)")
    elif unanswered:
        line += f"; {unanswered} refused with the call, not stored (ingesting them again is safe)"
    if progress.total:
        left = progress.total - progress.done - unanswered
        if left > 0:
            line += f"; {left} not sent"
    print(line, file=sys.stderr)
    return core.exit_for(code)


def register(sub: Any) -> None:
    supervised.register_run(sub)

    runs = sub.add_parser("runs", help="run records, and the runs the daemon started").add_subparsers(dest="runs_command", required=True)
    p = runs.add_parser("ingest", help="submit closed run records (control tier)",
                        description="Submit closed run records: JSON files, directories (every *.json below "
                                    "them) and - for stdin (one JSON record, or JSON lines). Prints a summary; "
                                    "names each rejected record and goes on; exit 1 when any was rejected.")
    p.add_argument("files", nargs="+", metavar="PATH", help="a run record file, a directory, or - for stdin")
    p.add_argument("--json", action="store_true", help="print one result per record as JSON")
    _backfill.add_wait_option(p)
    p.set_defaults(fn=cmd_runs_ingest)
    supervised.register_watch(runs)
