"""The `memactors` command line. Every operator command goes through MemoryService over the websocket
RPC (the CLI has no private path); `--json` prints the raw result for scripts.

The CLI finds the daemon the way the daemon finds its state: `--config` (before or after the
subcommand), else `$HARNESS_CONFIG`, else `$XDG_CONFIG_HOME/harness/harness.toml` (default
`~/.config/harness/harness.toml`); the state directory named there holds `daemon.json` (the addresses
actually bound) and the operator token files.

Start-up cost matters (`memactors --help` is typed by people): this module imports only the standard
library at the top; each command imports what it needs when it runs, so an RPC command never loads the
service, the store or the MCP SDK. `bench/cli_startup.py` measures it.

Exit codes (docs/operations.md has the table): 0 ok; 1 the command ran and reports a failure (doctor,
provider check, rejected records); 2 usage error (argparse); 3 daemon unavailable; 4 not found;
5 invalid argument or configuration; 6 permission denied or unauthenticated; 7 internal error;
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__

if TYPE_CHECKING:
    from .config import Config

SERVICE = "harness.v1.MemoryService"
DAEMON_FILE = "daemon.json"  # written by daemon.py; read here without importing the daemon

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_NOT_FOUND = 4
EXIT_INVALID = 5
EXIT_PERMISSION = 6
EXIT_INTERNAL = 7
EXIT_INTERRUPTED = 130

#: gRPC code name (of an RpcError or a MemactorsError) -> exit status.
CODE_EXITS = {
    "UNAVAILABLE": EXIT_UNAVAILABLE,
    "DEADLINE_EXCEEDED": EXIT_UNAVAILABLE,
    "NOT_FOUND": EXIT_NOT_FOUND,
    "INVALID_ARGUMENT": EXIT_INVALID,
    "FAILED_PRECONDITION": EXIT_INVALID,
    "OUT_OF_RANGE": EXIT_INVALID,
    "PERMISSION_DENIED": EXIT_PERMISSION,
    "UNAUTHENTICATED": EXIT_PERMISSION,
}

JSON_HELP = "print the raw result as JSON (for scripts)"


class CliError(Exception):
    """A failure the CLI explains in one line and maps to an exit status by its gRPC code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _config(args: argparse.Namespace) -> Config:
    from .config import load_config

    return load_config(Path(args.config) if getattr(args, "config", None) else None)


def read_daemon_file(state_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((state_dir / DAEMON_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def _operator_url(config: Config) -> str:
    found = read_daemon_file(config.store.path)
    if found and found.get("operator"):
        return str(found["operator"])
    return f"ws://{config.operator.address}/harness.v1"


def _token(config: Config, tier: str) -> str:
    """The operator token of `tier` from the state directory (the files rpc.ensure_tokens writes),
    read here so a command does not import the trio RPC client just to find it."""
    path = config.store.path / f"operator-{tier}.token"
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise CliError("UNAVAILABLE", f"no daemon has run with state directory {config.store.path} (no operator "
                                      "token file there); start one with `memactors serve`") from None
    except OSError as exc:
        raise CliError("PERMISSION_DENIED", f"cannot read {path}: {exc.strerror}") from None
    if not token:
        raise CliError("INVALID_ARGUMENT", f"operator token file {path} is empty")
    return token


async def _call(args: argparse.Namespace, method: str, params: dict[str, Any], tier: str = "read") -> Any:
    """One RPC call from inside a trio program (commands that run their own loop); imports the trio client."""
    from .rpc import connect_rpc

    config = _config_for(args, tier)
    async with connect_rpc(_operator_url(config), _token(config, tier)) as client:
        return await client.call(f"{SERVICE}/{method}", params)


def _config_for(args: argparse.Namespace, tier: str) -> Config:
    """The configuration; for a read command, with an invalid file, the state directory alone (the
    daemon runs on its last good configuration, and a read command can ask it what is wrong)."""
    from .errors import ConfigError

    try:
        return _config(args)
    except ConfigError as exc:
        if tier != "read":
            raise
        return _config_despite(args, exc)


def _config_despite(args: argparse.Namespace, error: Exception) -> Config:
    """Defaults plus the file's `[store] path` if that much can be read; warns naming the config error."""
    import tomllib

    import attrs

    from .config import Config, StoreConfig, default_config_path

    print(f"memactors: warning: {error}; using the state directory only", file=sys.stderr)
    path = Path(args.config) if args.config else default_config_path()
    try:
        store = tomllib.loads(path.read_text(encoding="utf-8")).get("store", {}).get("path")
    except (OSError, ValueError, AttributeError):
        store = None
    config = Config()
    if isinstance(store, str):
        state = Path(store).expanduser()
        config = attrs.evolve(config, store=StoreConfig(state if state.is_absolute() else path.parent / state))
    return config


def call(args: argparse.Namespace, method: str, params: dict[str, Any], tier: str = "read") -> Any:
    """One RPC call over the standard-library websocket client (see _wsclient: the trio client's
    imports alone cost more than a read command's start-up budget)."""
    from ._wsclient import WsRpcError, call_once

    config = _config_for(args, tier)
    token = _token(config, tier)
    try:
        return call_once(_operator_url(config), token, f"{SERVICE}/{method}", params)
    except WsRpcError as exc:
        raise CliError(exc.code, f"{exc.code}: {exc.message}") from None


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def _notice(result: dict[str, Any]) -> None:
    """Tell the operator on stderr what the daemon made of a `--repo` value (normalised, matched by its
    tail, or unknown with close known ones), so a scope mismatch is never silent."""
    repo = result.get("repo_match")
    if not repo:
        return
    if repo.get("status") == "unknown":
        close = repo.get("close") or []
        hint = f"; close known ones: {', '.join(close)}" if close else "; no known repository is close"
        print(f"memactors: no episodes in repository {repo['key']}{hint}", file=sys.stderr)
    elif repo.get("given") != repo.get("key"):
        print(f"memactors: repository {repo['given']!r} read as {repo['key']}", file=sys.stderr)


# -- commands ------------------------------------------------------------------------------------------

def cmd_serve(args: argparse.Namespace) -> int:
    from .daemon import serve_main

    return serve_main(Path(args.config) if args.config else None)


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

    from .rpc import RpcError, connect_rpc

    config = _config(args)
    token = _token(config, "control")
    url = _operator_url(config)
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
        _print_json(results)
    else:
        print(f"{progress.done} record(s): {_summary(counts)}")
    return EXIT_FAILED if counts["rejected"] else EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """`memactors run H`: StartRun, then with --wait follow it (WaitRun) to its recorded end."""
    from .errors import exit_status

    params: dict[str, Any] = {"harness": args.harness}
    if args.prompt is not None:
        params["prompt"] = args.prompt
    elif args.prompt_file is not None:
        try:
            params["prompt"] = Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"memactors: --prompt-file {args.prompt_file}: cannot be read: {type(exc).__name__}",
                  file=sys.stderr)
            return 2
    import trio

    from .rpc import connect_rpc

    config = _config(args)
    token = _token(config, "control")

    async def run() -> dict[str, Any]:
        async with connect_rpc(_operator_url(config), token) as client:
            state = await client.call(f"{SERVICE}/StartRun", params)
            if not args.json:
                print(f"run {state['run_id']} of {state['harness']} started ({state['adapter']})", flush=True)
            while args.wait and state["state"] != "ended":
                state = await client.call(f"{SERVICE}/WaitRun", {"harness": state["harness"],
                                                                  "run_id": state["run_id"], "wait_seconds": 25})
            return state

    state = trio.run(run)
    if args.json:
        _print_json({k: state.get(k) for k in ("run_id", "harness", "outcome", "episode_id")})
    elif state["state"] == "ended":
        episode = state.get("episode_id") or f"no episode ({state.get('ingest')})"
        print(f"run {state['run_id']}: {state['outcome']} ({state['reason']}), {episode}")
        if state.get("error"):
            print(f"memactors: the agent could not be started: {state['error']}", file=sys.stderr)
    return exit_status(state["outcome"]) if args.wait else 0
#: `memory status` exit codes (docs/operations.md): the daemon answered, but its provider is down / incompatible.
EXIT_PROVIDER_DOWN = 10
EXIT_PROVIDER_INCOMPATIBLE = 11


def cmd_status(args: argparse.Namespace) -> int:
    st = call(args, "Status", {})
    code = {"down": EXIT_PROVIDER_DOWN, "incompatible": EXIT_PROVIDER_INCOMPATIBLE}.get(st["state"], 0)
    if args.json:
        _print_json(st)
        return code
    info = st.get("provider_info") or {}
    print(f"provider   {st['provider']} ({st['transport']})  {info.get('name', '')} {info.get('version', '')}".rstrip())
    print(f"state      {st['state']}  contract {st['contract']}  breaker {st['breaker']}")
    if st.get("last_error"):
        print(f"last error {st['last_error']}")
    c = st["counts"]
    print(f"episodes   {c['live_episodes']} live, {c['episodes'] - c['live_episodes']} forgotten, {c['indexed_ids']} indexed ids")
    p = st["pending"]
    print(f"pending    {p['records']} records, {p['forgets']} forgets; failed: {p['record_failed']} records, "
          f"{p['forget_failed']} forgets")
    if code:
        print(f"memactors: provider {st['provider']} is {st['state']} for {int(st['state_for_seconds'])} s: "
              f"{st.get('last_error') or 'no detail'}", file=sys.stderr)
    return code


def cmd_episodes(args: argparse.Namespace) -> int:
    if args.episode_id:
        ep = call(args, "GetEpisode", {"episode_id": args.episode_id})
        if args.json:
            _print_json(ep)
        else:
            print(ep.get("text") or f"episode {ep['episode_id']} (forgotten {ep['forgotten_at']})", end="")
        return 0
    params: dict[str, Any] = {k: v for k, v in {"harness": args.harness, "repo": args.repo, "since": args.since,
                                                "after": args.after}.items() if v}
    params["limit"] = args.limit
    result = call(args, "ListEpisodes", params)
    _notice(result)
    if args.json:
        _print_json(result)
        return 0
    rows = result["episodes"]
    if not rows:
        print("no episodes")
    for r in rows:
        print(f"{r['episode_id']}  {r['started_at'][:19]}  {r['harness']:<16} run {r['run_id']:<10} "
              f"{r['outcome']:<10} {r['repo']}@{r['branch']}")
    total = result.get("total")
    if total is not None and rows:
        line = f"-- {len(rows)} shown of {total}"
        if result.get("next_cursor"):
            line += f"; next page: --after {result['next_cursor']}"
        print(line)
    return 0


def _no_harness_table(name: str, what: str = "--as") -> str:
    """The error for `--as NAME` (or a briefing preview of NAME) without a `[harness.NAME]` table:
    episodes may well list the harness (runs record their harness name), but only a configured table
    says what it sees."""
    subject = f"--as {name}" if what == "--as" else f"a briefing for {name}"
    hint = "\nor recall as the repository: --repo forge.example/acme/api" if what == "--as" else ""
    return (f"{subject} needs a [harness.{name}] table in the global harness.toml (episodes may list "
            f"{name}, but only a configured harness has a view); for example:\n"
            f"  [harness.{name}]\n  harness = \"claude-code\"\n  workdir = \"~/src/api\"{hint}")



def cmd_recall(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"query": args.query, "limit": args.limit}
    if args.repo:
        params["repo"] = args.repo
    if args.as_harness:
        params["as"] = args.as_harness
    if args.paths:
        params["paths"] = args.paths
    try:
        result = call(args, "Recall", params)
    except CliError as exc:
        if exc.code == "INVALID_ARGUMENT" and args.as_harness and "params.as names no configured" in exc.message:
            raise CliError(exc.code, _no_harness_table(args.as_harness)) from None
        raise
    _notice(result)
    if args.json:
        _print_json(result)
        return 0
    if result.get("document") is not None:
        print(result["document"])
        return 0
    if result.get("degraded"):
        print(f"(degraded: {result['degraded']})")
    for item in result.get("episodes", []):
        print(f"- episode {item['episode_id']} · provider {item['provider']} · run {item['run_id']} · "
              f"harness {item['harness']} · {item['outcome']} · {item['repo']}@{item['branch']}")
        for line in item["text"].splitlines()[:12]:
            print(f"    {line}")
    if not result.get("episodes"):
        print("no episodes")
    return 0


def cmd_briefing(args: argparse.Namespace) -> int:
    """`memory briefing H`: the operator preview (GetBriefing) — no cache, no exposure."""
    try:
        result = call(args, "GetBriefing", {"harness": args.harness})
    except CliError as exc:
        if exc.code == "INVALID_ARGUMENT" and "params.harness names no configured" in exc.message:
            raise CliError(exc.code, _no_harness_table(args.harness, "briefing")) from None
        raise
    if args.json:
        _print_json(result)
        return 0
    if result["document"]:
        print(result["document"])
    else:
        print(f"(empty briefing for {result['harness']})")
    return 0


def cmd_facts_add(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"scope": args.scope, "text": args.text, "confidence": args.confidence,
                              "status": args.status}
    if args.id:
        params["id"] = args.id
    result = call(args, "AddFact", params, tier="control")
    _print_json(result) if args.json else print(f"{result['id']} {result['status']} {result['scope']}")
    return 0


def cmd_pr_link(args: argparse.Namespace) -> int:
    result = call(args, "LinkPullRequest", {"repo": args.repo, "branch": args.branch, "url": args.url},
                  tier="control")
    _print_json(result) if args.json else print(f"linked {result['url']} to {result['repo']}@{result['branch']}")
    return 0


def cmd_presence_report(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"harness": args.harness, "run_id": args.run, "session_id": args.session,
                              "repo": args.repo, "paths": args.paths or [], "ttl_seconds": args.ttl}
    if args.branch:
        params["branch"] = args.branch
    result = call(args, "ReportPresence", params, tier="control")
    _print_json(result) if args.json else print(f"present until {result['expires_at']}")
    return 0


def cmd_vote(args: argparse.Namespace) -> int:
    result = call(args, "CastVote", {"fact_id": args.fact_id, "run_id": args.run, "harness": args.harness,
                                     "stance": args.stance}, tier="control")
    _print_json(result) if args.json else print(
        f"vote {result['id']} on {result['fact_id']}: {'counted' if result['counted'] else 'stored, not counted'}")
    return 0


def confirm(question: str, *, assume_yes: bool) -> bool:
    """Ask `question` on the terminal; refuse (CliError) when there is no terminal to ask on."""
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        raise CliError("INVALID_ARGUMENT", "refusing to forget without confirmation: stdin is not a terminal; "
                                           "pass --yes to confirm")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def cmd_forget(args: argparse.Namespace) -> int:
    if not confirm(f"Forget episode {args.episode_id} everywhere (stored text, summary and every provider's "
                   "copies)? This cannot be undone.", assume_yes=args.yes):
        print("not forgotten", file=sys.stderr)
        return EXIT_FAILED
    result = call(args, "Forget", {"episode_id": args.episode_id}, tier="control")
    if args.json:
        _print_json(result)
        return 0
    print(f"forgotten {result['episode_id']} at {result['forgotten_at']}: {result['ids']} provider id(s),"
          f" {result['forgotten']} forgotten, {result['pending']} pending, {result['failed']} failed")
    return 0


def cmd_provider_check(args: argparse.Namespace) -> int:
    from .conformance import CheckResult, ConformanceReport, format_report

    params = {"provider": args.provider} if args.provider else {}
    result = call(args, "CheckProvider", params, tier="control")
    if args.json:
        _print_json(result)
    else:
        checks = tuple(CheckResult(**c) for c in result["checks"])
        fields = {k: result.get(k) for k in ("provider", "contract", "provider_name", "provider_version")}
        print(format_report(ConformanceReport(checks=checks, unforgotten_ids=tuple(result.get("unforgotten_ids", ())),
                                              **fields)))
    return 0 if result["ok"] else 1


def cmd_provider_schema(args: argparse.Namespace) -> int:
    from .contract import schema_document

    _print_json(schema_document())
    return 0


def cmd_serve_builtin(args: argparse.Namespace) -> int:
    import trio

    from .builtin import serve_builtin_stdio
    from .service import DB_NAME

    db = Path(args.db) if args.db else _config(args).store.path / DB_NAME
    trio.run(serve_builtin_stdio, db)
    return 0


def _providers(sub: Any, memory: Any) -> None:
    """`memory forget`, `memory provider check|schema` and `provider serve-builtin` (REQ-3, 4, 10, 11)."""
    p = memory.add_parser("forget", help="forget an episode everywhere (control tier); asks first")
    p.add_argument("episode_id", help="the episode to forget (ep_…, from `memory episodes`)")
    p.add_argument("--yes", "-y", action="store_true",
                   help="do not ask for confirmation (required when stdin is not a terminal)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_forget)

    prov = memory.add_parser("provider", help="the memory provider").add_subparsers(
        dest="provider_command", required=True)
    p = prov.add_parser("check", help="run the conformance suite (control tier); non-zero on any fail")
    p.add_argument("--provider", metavar="NAME", help="a global [mcp.<name>] upstream, or builtin")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_provider_check)
    p = prov.add_parser("schema", help="print the contract's JSON Schemas")
    p.set_defaults(fn=cmd_provider_schema)

    top = sub.add_parser("provider", help="memory providers").add_subparsers(dest="provider_command", required=True)
    p = top.add_parser("serve-builtin", help="serve the built-in provider over stdio (an [mcp.<name>] upstream)")
    p.add_argument("--stdio", action="store_true", required=True, help="serve over stdin/stdout (the only transport)")
    p.add_argument("--db", metavar="FILE", help="store file (default: the configured state directory's memactors.db)")
    p.set_defaults(fn=cmd_serve_builtin)


def _feeds(sub: Any) -> None:
    """Control-tier feeds for the neighbours recall and briefings read (facts, PRs, presence, votes)."""
    facts = sub.add_parser("facts", help="facts (control tier)").add_subparsers(dest="facts_command", required=True)
    p = facts.add_parser("add", help="add or update a fact")
    p.add_argument("text", help="the fact, one or two sentences")
    p.add_argument("--scope", required=True, help="fleet or project:<repo>")
    p.add_argument("--confidence", type=float, required=True, help="0.0 to 1.0")
    p.add_argument("--status", default="live", choices=["live", "suspect", "retired"], help="default: live")
    p.add_argument("--id", help="update the fact with this id instead of adding one")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_facts_add)

    pr = sub.add_parser("pr", help="pull requests (control tier)").add_subparsers(dest="pr_command", required=True)
    p = pr.add_parser("link", help="link a pull request to a repository branch")
    p.add_argument("repo", help="repository key, e.g. forge.example/acme/api")
    p.add_argument("branch", help="the branch the pull request is from")
    p.add_argument("url", help="the pull request's URL")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_pr_link)

    presence = sub.add_parser("presence", help="live presence (control tier)").add_subparsers(
        dest="presence_command", required=True)
    p = presence.add_parser("report", help="report a live session")
    p.add_argument("harness", help="the [harness.<name>] the session runs as")
    p.add_argument("--run", required=True, help="run id")
    p.add_argument("--session", required=True, help="session id")
    p.add_argument("--repo", required=True, help="repository key or remote URL")
    p.add_argument("--branch", help="the branch checked out")
    p.add_argument("--paths", nargs="+", metavar="P", help="paths being edited, relative to the repository root")
    p.add_argument("--ttl", type=int, default=300, help="seconds until the report expires (default 300)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_presence_report)

    p = sub.add_parser("vote", help="cast a run's vote on a fact (control tier)")
    p.add_argument("fact_id", help="the fact voted on")
    p.add_argument("--run", required=True, help="the voting run's id")
    p.add_argument("--harness", required=True, help="the voting run's harness")
    p.add_argument("--stance", required=True, choices=["support", "oppose"], help="support or oppose")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_vote)


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import Row, format_rows

    try:
        result = call(args, "Doctor", {})
    except CliError as exc:
        if exc.code != "UNAVAILABLE":
            raise
        result = {"ok": False, "rows": [{"status": "fail", "name": "daemon", "message": exc.message}]}
    if args.json:
        _print_json(result)
    else:
        print(format_rows([Row(**r) for r in result["rows"]]))
    return 0 if result["ok"] else 1


def cmd_tui(args: argparse.Namespace) -> int:
    from .tui import HarnessEntry, run_tui

    config = _config(args)
    entries = [HarnessEntry(name, h.harness, h.memory_briefing) for name, h in sorted(config.harness.items())]
    run_tui(entries, _operator_url(config), _token(config, "read"))
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0


CONFIG_HELP = ("global harness.toml (default: $HARNESS_CONFIG, else $XDG_CONFIG_HOME/harness/harness.toml, "
               "else ~/.config/harness/harness.toml); accepted before or after the subcommand")


def subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser under `parser` (itself included), each once."""
    seen: set[int] = set()
    stack = [parser]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())


def _config_everywhere(parser: argparse.ArgumentParser) -> None:
    """Let `--config` follow any subcommand too. Default SUPPRESS, so a subcommand that does not see it
    leaves the top-level value alone."""
    for p in subparsers(parser):
        if p is not parser and "--config" not in p._option_string_actions:
            p.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=CONFIG_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memactors", description="Episodic memory and briefings for fleets of coding agents (SPEC-0030).",
        epilog="Exit codes: 0 ok, 1 the command reports a failure, 2 usage, 3 daemon unavailable, 4 not found, "
               "5 invalid argument or configuration, 6 permission denied, 7 internal error, 130 interrupted.")
    parser.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    parser.add_argument("--version", action="version", version=f"memactors {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("doctor", help="health rows for memory (exit 1 on any fail)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_doctor)

    p = sub.add_parser("tui", help="terminal UI: harnesses, recent episodes, provider state, briefing preview (B)")
    p.set_defaults(fn=cmd_tui)

    p = sub.add_parser("serve", help="run the daemon in the foreground")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser(
        "run", help="run a harness's prompt one-shot now, supervised by the daemon (control tier)",
        description="Start a run of [harness.<name>] in its workdir with its adapter's agent CLI. The daemon "
                    "supervises it (timeout, stop on shutdown), gives it its briefing and the gateway, and "
                    "records its episode when it ends.",
        epilog="With --wait the exit status is the outcome's: 0 succeeded, 1 failed, 12 timed_out, "
               "13 cancelled, 14 crashed (an agent that could not be started is crashed); a refused "
               "start exits like any command (5 invalid argument, 3 daemon unavailable, ...).")
    p.add_argument("harness", help="the [harness.<name>] to run")
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", metavar="TEXT", help="the prompt for this run only (instead of the configured one)")
    prompt.add_argument("--prompt-file", metavar="F", help="read this run's prompt from file F")
    p.add_argument("--wait", action="store_true", help="follow the run until it is recorded; exit with its outcome")
    p.add_argument("--json", action="store_true", help="print {run_id, harness, outcome, episode_id}")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       description="Print a completion script. bash: `memactors completion bash > "
                                   "~/.local/share/bash-completion/completions/memactors`; zsh: `memactors "
                                   "completion zsh > \"${fpath[1]}/_memactors\"`.")
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")
    p.set_defaults(fn=cmd_completion)

    runs = sub.add_parser("runs", help="run records").add_subparsers(dest="runs_command", required=True)
    p = runs.add_parser("ingest", help="submit closed run records (control tier)",
                        description="Submit closed run records: JSON files, directories (every *.json below "
                                    "them) and - for stdin (one JSON record, or JSON lines). Prints a summary; "
                                    "names each rejected record and goes on; exit 1 when any was rejected.")
    p.add_argument("files", nargs="+", metavar="PATH", help="a run record file, a directory, or - for stdin")
    p.add_argument("--json", action="store_true", help="print one result per record as JSON")
    p.set_defaults(fn=cmd_runs_ingest)

    memory = sub.add_parser("memory", help="episodic memory").add_subparsers(dest="memory_command", required=True)
    p = memory.add_parser("status", help="provider, contract, state, counts, pending")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_status)

    p = memory.add_parser("episodes", help="list episodes (newest first, paged), or show one by id")
    p.add_argument("episode_id", nargs="?", help="show this episode instead of listing")
    p.add_argument("--harness", help="only episodes of this harness")
    p.add_argument("--repo", help="only episodes of this repository (key, remote URL, or owner/name)")
    p.add_argument("--since", help="a duration back from now (7d, 12h) or an RFC 3339 time")
    p.add_argument("--limit", type=_positive, default=100, help="episodes per page (default 100, at most 1000)")
    p.add_argument("--after", metavar="CURSOR", help="the next-page cursor printed by the previous page")
    p.add_argument("--json", action="store_true", help=JSON_HELP + " ({episodes, total, next_cursor})")
    p.set_defaults(fn=cmd_episodes)

    p = memory.add_parser("recall", help="recall as a repository or harness would")
    p.add_argument("query", help="words to recall by")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--repo", help="as this repository: key (forge.example/acme/api), remote URL, or owner/name")
    who.add_argument("--as", dest="as_harness", metavar="HARNESS",
                     help="as the harness configured in [harness.HARNESS] would")
    p.add_argument("--paths", nargs="+", metavar="P", help="paths the caller works on (boosts episodes touching them)")
    p.add_argument("--limit", type=_positive, default=8, help="episodes at most (default 8)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_recall)

    p = memory.add_parser("briefing", help="preview the briefing a harness would receive now")
    p.add_argument("harness", help="a configured [harness.<name>]")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_briefing)
    _providers(sub, memory)
    _feeds(sub)
    from .cli_agents import register as register_agent_commands

    register_agent_commands(sub)  # token mint, mcp-config, hook claude-code session-end (cli_agents.py)
    _config_everywhere(parser)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _exit_for(code: str) -> int:
    return CODE_EXITS.get(code, EXIT_INTERNAL)


def main(argv: Sequence[str] | None = None) -> int:
    from .errors import MemactorsError

    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.fn(args))
    except KeyboardInterrupt:
        print("memactors: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CliError as exc:
        print(f"memactors: {exc.message}", file=sys.stderr)
        return _exit_for(exc.code)
    except MemactorsError as exc:  # RpcError, ConfigError and the other sentinels carry a gRPC code
        rpc_code = getattr(exc, "code", "INTERNAL")
        prefix = f"{rpc_code}: " if type(exc).__name__ == "RpcError" else ""
        print(f"memactors: {prefix}{exc}", file=sys.stderr)
        return _exit_for(rpc_code)
    except BrokenPipeError:  # `memactors ... | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    # `python -m memactors.cli`: run the imported module's main, not this `__main__` copy, so errors
    # raised by modules that import memactors.cli (cli_agents) are the classes main() catches.
    from memactors.cli import main as _main

    sys.exit(_main())
