"""Runs: `run` (a supervised one-shot now) and the `runs` group (`runs ingest`); the commands for the runs
the daemon supervises (`run`, `runs list|show|wait|cancel|logs`) live in `supervised`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from . import _core as core
from . import supervised
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


class Progress:
    """A one-line progress bar on stderr when it is a terminal; silent otherwise."""

    def __init__(self, total: int | None, enabled: bool) -> None:
        self.total, self.enabled, self.done, self._shown = total, enabled, 0, False

    def line(self, counts: dict[str, int]) -> str:
        tally = " ".join(f"{k} {v}" for k, v in counts.items() if v)
        if self.total:
            width = 30
            filled = width * self.done // self.total
            return f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {tally}"
        return f"{self.done} records {tally}"

    def update(self, counts: dict[str, int]) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K" + self.line(counts))
            sys.stderr.flush()
            self._shown = True

    def clear(self) -> None:
        if self.enabled and self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _summary(counts: dict[str, int]) -> str:
    parts = [f"{counts[k]} {k}" for k in ("recorded", "queued", "duplicate", "skipped", "rejected")
             if counts[k] or k != "queued"]
    parts += [f"{v} {k}" for k, v in counts.items() if k not in ("recorded", "queued", "duplicate", "skipped",
                                                                  "rejected") and v]
    return ", ".join(parts)


def _record_problem(record: Any) -> str | None:
    """Why a parsed record cannot be sent at all (so it is rejected by name, not the whole batch)."""
    if not isinstance(record, dict):
        return "a run record must be a JSON object"
    try:
        json.dumps(record, allow_nan=False)
    except ValueError:
        return "not sendable as JSON: it holds Infinity or NaN"
    except RecursionError:
        return "JSON nested too deeply"
    return None


def cmd_runs_ingest(args: argparse.Namespace) -> int:
    import codecs
    import signal
    import threading

    import trio

    from ..rpc import RpcError, connect_rpc

    config = core.load(args)
    token = core.token_for(config, "control")
    url = core.operator_url(config)
    sources = list(ingest_sources(args.files))
    counts: dict[str, int] = {"recorded": 0, "queued": 0, "duplicate": 0, "skipped": 0, "rejected": 0}
    results: list[dict[str, Any]] = []
    progress = Progress(None if "-" in sources else len(sources), sys.stderr.isatty() and not args.json)
    interrupted = False

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

    async def send(client: Any, batch: list[tuple[str, Any]]) -> None:
        if not batch:
            return
        items = [{"record": record, "source": source} for source, record in batch]
        try:
            answer = await client.call(f"{SERVICE}/IngestRuns", {"records": items})
        except RpcError as exc:
            if exc.code not in ("UNIMPLEMENTED", "INVALID_ARGUMENT"):
                raise
            # A daemon without the batch RPC, or a batch refused whole (say, one record nested past the
            # frame's depth limit): one IngestRun per record, so each is judged on its own.
            answer = None
        if answer is not None:
            for (source, _), result in zip(batch, answer["results"], strict=True):
                tally(source, result)
                progress.done += 1
        else:
            for source, record in batch:
                try:
                    tally(source, await client.call(f"{SERVICE}/IngestRun", {"record": record, "source": source}))
                except RpcError as exc:
                    if exc.code not in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"):
                        raise
                    rejected(source, exc.message)
                progress.done += 1
                progress.update(counts)
        progress.update(counts)
        batch.clear()

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

    async def work() -> None:
        batch: list[tuple[str, Any]] = []
        async with connect_rpc(url, token) as client:
            for source in sources:
                if source == "-":
                    async for chunk in stdin_chunks():
                        for label, record, error in chunk:
                            if record is _TOO_DEEP:
                                rejected(label, "JSON nested too deeply")
                                progress.done += 1
                            elif error is not None:
                                rejected(label, error)
                                progress.done += 1
                            elif (problem := _record_problem(record)) is not None:
                                rejected(label, problem)
                                progress.done += 1
                            else:
                                batch.append((label, record))
                        await send(client, batch)  # what arrived is sent now, not at EOF
                    continue
                try:
                    record = json.loads(await trio.Path(source).read_text(encoding="utf-8"))
                except UnicodeDecodeError:
                    rejected(source, "not UTF-8 text")
                    progress.done += 1
                    continue
                except OSError as exc:
                    rejected(source, exc.strerror or type(exc).__name__)
                    progress.done += 1
                    continue
                except RecursionError:
                    rejected(source, "JSON nested too deeply")
                    progress.done += 1
                    continue
                except ValueError as exc:
                    rejected(source, f"not valid JSON ({exc})")
                    progress.done += 1
                    continue
                if (problem := _record_problem(record)) is not None:
                    rejected(source, problem)
                    progress.done += 1
                    continue
                batch.append((source, record))
                if len(batch) >= INGEST_BATCH:
                    await send(client, batch)
            await send(client, batch)

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

    try:
        trio.run(main, restrict_keyboard_interrupt_to_checkpoints=True)
    finally:
        progress.clear()
    if interrupted:
        print(f"memactors: interrupted after {progress.done} record(s): {_summary(counts)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.json:
        core.print_json(results)
    else:
        print(f"{progress.done} record(s): {_summary(counts)}")
    return EXIT_FAILED if counts["rejected"] else EXIT_OK


def register(sub: Any) -> None:
    supervised.register_run(sub)

    runs = sub.add_parser("runs", help="run records, and the runs the daemon started").add_subparsers(dest="runs_command", required=True)
    p = runs.add_parser("ingest", help="submit closed run records (control tier)",
                        description="Submit closed run records: JSON files, directories (every *.json below "
                                    "them) and - for stdin (one JSON record, or JSON lines). Prints a summary; "
                                    "names each rejected record and goes on; exit 1 when any was rejected.")
    p.add_argument("files", nargs="+", metavar="PATH", help="a run record file, a directory, or - for stdin")
    p.add_argument("--json", action="store_true", help="print one result per record as JSON")
    p.set_defaults(fn=cmd_runs_ingest)
    supervised.register_watch(runs)
