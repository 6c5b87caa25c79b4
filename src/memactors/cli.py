"""The `memactors` command line. Every operator command goes through MemoryService over the websocket
RPC (the CLI has no private path); `--json` prints the raw result for scripts.

The CLI finds the daemon the way the daemon finds its state: `--config`, else `$HARNESS_CONFIG`, else
`~/.config/harness/harness.toml`; the state directory named there holds `daemon.json` (the addresses
actually bound) and the operator token files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from .cli_agents import register as register_agent_commands
from .config import Config, load_config
from .daemon import read_daemon_file, serve_main
from .doctor import Row, format_rows
from .errors import ConfigError, MemactorsError
from .rpc import RpcError, connect_rpc, read_token
from .tui import HarnessEntry, run_tui

SERVICE = "harness.v1.MemoryService"


def _config(args: argparse.Namespace) -> Config:
    return load_config(Path(args.config) if args.config else None)


def _operator_url(config: Config) -> str:
    found = read_daemon_file(config.store.path)
    if found and found.get("operator"):
        return str(found["operator"])
    return f"ws://{config.operator.address}/harness.v1"


async def _call(args: argparse.Namespace, method: str, params: dict[str, Any], tier: str = "read") -> Any:
    config = _config(args)
    token = read_token(config.store.path, tier)  # type: ignore[arg-type]
    async with connect_rpc(_operator_url(config), token) as client:
        return await client.call(f"{SERVICE}/{method}", params)


def call(args: argparse.Namespace, method: str, params: dict[str, Any], tier: str = "read") -> Any:
    return trio.run(_call, args, method, params, tier)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


# -- commands ------------------------------------------------------------------------------------------

def cmd_serve(args: argparse.Namespace) -> int:
    return serve_main(Path(args.config) if args.config else None)


def cmd_runs_ingest(args: argparse.Namespace) -> int:
    config = _config(args)
    token = read_token(config.store.path, "control")
    failures = 0

    async def run() -> list[dict[str, Any]]:
        nonlocal failures
        results = []
        async with connect_rpc(_operator_url(config), token) as client:
            for i, name in enumerate(args.files, start=1):
                try:
                    data = json.loads(await trio.Path(name).read_text(encoding="utf-8"))
                    result = await client.call(f"{SERVICE}/IngestRun", {"record": data, "source": name})
                    results.append({"file": name, **result})
                    if not args.json:
                        detail = result.get("episode_id") or result.get("reason", "")
                        print(f"[{i}/{len(args.files)}] {name}: {result['outcome']} {detail}".rstrip(), flush=True)
                except (OSError, ValueError, RpcError) as exc:
                    failures += 1
                    message = exc.message if isinstance(exc, RpcError) else str(exc)
                    results.append({"file": name, "outcome": "rejected", "error": message})
                    if not args.json:
                        print(f"[{i}/{len(args.files)}] {name}: rejected: {message}", file=sys.stderr, flush=True)
        return results

    results = trio.run(run)
    if args.json:
        _print_json(results)
    return 1 if failures else 0


def cmd_run(args: argparse.Namespace) -> int:
    """`memactors run H`: StartRun, then with --wait follow it (WaitRun) to its recorded end."""
    from .actors.runs import exit_status

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
    config = _config(args)

    async def run() -> dict[str, Any]:
        async with connect_rpc(_operator_url(config), read_token(config.store.path, "control")) as client:
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


def cmd_status(args: argparse.Namespace) -> int:
    st = call(args, "Status", {})
    if args.json:
        _print_json(st)
        return 0
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
    return 0


def cmd_episodes(args: argparse.Namespace) -> int:
    if args.episode_id:
        ep = call(args, "GetEpisode", {"episode_id": args.episode_id})
        if args.json:
            _print_json(ep)
        else:
            print(ep.get("text") or f"episode {ep['episode_id']} (forgotten {ep['forgotten_at']})", end="")
        return 0
    params = {k: v for k, v in {"harness": args.harness, "repo": args.repo, "since": args.since}.items() if v}
    result = call(args, "ListEpisodes", params)
    if args.json:
        _print_json(result)
        return 0
    rows = result["episodes"]
    if not rows:
        print("no episodes")
    for r in rows:
        print(f"{r['episode_id']}  {r['started_at'][:19]}  {r['harness']:<16} run {r['run_id']:<10} "
              f"{r['outcome']:<10} {r['repo']}@{r['branch']}")
    return 0


def cmd_recall(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"query": args.query, "limit": args.limit}
    if args.repo:
        params["repo"] = args.repo
    if args.as_harness:
        params["as"] = args.as_harness
    if args.paths:
        params["paths"] = args.paths
    result = call(args, "Recall", params)
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
    result = call(args, "GetBriefing", {"harness": args.harness})
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


def cmd_forget(args: argparse.Namespace) -> int:
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
    from .builtin import serve_builtin_stdio
    from .service import DB_NAME

    db = Path(args.db) if args.db else _config(args).store.path / DB_NAME
    trio.run(serve_builtin_stdio, db)
    return 0


def _providers(sub: Any, memory: Any) -> None:
    """`memory forget`, `memory provider check|schema` and `provider serve-builtin` (REQ-3, 4, 10, 11)."""
    p = memory.add_parser("forget", help="forget an episode everywhere (control tier)")
    p.add_argument("episode_id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_forget)

    prov = memory.add_parser("provider", help="the memory provider").add_subparsers(
        dest="provider_command", required=True)
    p = prov.add_parser("check", help="run the conformance suite (control tier); non-zero on any fail")
    p.add_argument("--provider", metavar="NAME", help="a global [mcp.<name>] upstream, or builtin")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_provider_check)
    p = prov.add_parser("schema", help="print the contract's JSON Schemas")
    p.set_defaults(fn=cmd_provider_schema)

    top = sub.add_parser("provider", help="memory providers").add_subparsers(dest="provider_command", required=True)
    p = top.add_parser("serve-builtin", help="serve the built-in provider over stdio (an [mcp.<name>] upstream)")
    p.add_argument("--stdio", action="store_true", required=True, help="serve over stdin/stdout (the only transport)")
    p.add_argument("--db", help="store file (default: the configured state directory's memactors.db)")
    p.set_defaults(fn=cmd_serve_builtin)


def _feeds(sub: Any) -> None:
    """Control-tier feeds for the neighbours recall and briefings read (facts, PRs, presence, votes)."""
    facts = sub.add_parser("facts", help="facts (control tier)").add_subparsers(dest="facts_command", required=True)
    p = facts.add_parser("add", help="add or update a fact")
    p.add_argument("text")
    p.add_argument("--scope", required=True, help="fleet or project:<repo>")
    p.add_argument("--confidence", type=float, required=True)
    p.add_argument("--status", default="live", choices=["live", "suspect", "retired"])
    p.add_argument("--id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_facts_add)

    pr = sub.add_parser("pr", help="pull requests (control tier)").add_subparsers(dest="pr_command", required=True)
    p = pr.add_parser("link", help="link a pull request to a repository branch")
    p.add_argument("repo")
    p.add_argument("branch")
    p.add_argument("url")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_pr_link)

    presence = sub.add_parser("presence", help="live presence (control tier)").add_subparsers(
        dest="presence_command", required=True)
    p = presence.add_parser("report", help="report a live session")
    p.add_argument("harness")
    p.add_argument("--run", required=True)
    p.add_argument("--session", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--branch")
    p.add_argument("--paths", nargs="+", metavar="P")
    p.add_argument("--ttl", type=int, default=300, help="seconds until the report expires (default 300)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_presence_report)

    p = sub.add_parser("vote", help="cast a run's vote on a fact (control tier)")
    p.add_argument("fact_id")
    p.add_argument("--run", required=True)
    p.add_argument("--harness", required=True)
    p.add_argument("--stance", required=True, choices=["support", "oppose"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_vote)


def cmd_doctor(args: argparse.Namespace) -> int:
    try:
        result = call(args, "Doctor", {})
    except RpcError as exc:
        if exc.code != "UNAVAILABLE":
            raise
        result = {"ok": False, "rows": [{"status": "fail", "name": "daemon", "message": exc.message}]}
    if args.json:
        _print_json(result)
    else:
        print(format_rows([Row(**r) for r in result["rows"]]))
    return 0 if result["ok"] else 1


def cmd_tui(args: argparse.Namespace) -> int:
    config = _config(args)
    entries = [HarnessEntry(name, h.harness, h.memory_briefing) for name, h in sorted(config.harness.items())]

    def load(harness: str) -> tuple[Any, Any]:
        return call(args, "GetBriefing", {"harness": harness}), call(args, "Status", {})

    run_tui(entries, load)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memactors", description="Episodic memory and briefings for fleets of coding agents (SPEC-0030).")
    parser.add_argument("--config", help="global harness.toml (default: $HARNESS_CONFIG or ~/.config/harness/harness.toml)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="health rows for memory (exit 1 on any fail)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_doctor)

    p = sub.add_parser("tui", help="harness list with the read-only briefing overlay (B)")
    p.set_defaults(fn=cmd_tui)

    p = sub.add_parser("serve", help="run the daemon in the foreground")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser(
        "run", help="run a harness's prompt one-shot now, supervised by the daemon (control tier)",
        description="Start a run of [harness.<name>] in its workdir with its adapter's agent CLI. The daemon "
                    "supervises it (timeout, stop on shutdown), gives it its briefing and the gateway, and "
                    "records its episode when it ends.",
        epilog="With --wait the exit status is the outcome's: 0 succeeded, 1 failed, 3 timed_out, "
               "4 cancelled, 5 crashed; 2 when the run could not be started.")
    p.add_argument("harness", help="the [harness.<name>] to run")
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", metavar="TEXT", help="the prompt for this run only (instead of the configured one)")
    prompt.add_argument("--prompt-file", metavar="F", help="read this run's prompt from file F")
    p.add_argument("--wait", action="store_true", help="follow the run until it is recorded; exit with its outcome")
    p.add_argument("--json", action="store_true", help="print {run_id, harness, outcome, episode_id}")
    p.set_defaults(fn=cmd_run)

    runs = sub.add_parser("runs", help="run records").add_subparsers(dest="runs_command", required=True)
    p = runs.add_parser("ingest", help="submit closed run records (JSON files); control tier")
    p.add_argument("files", nargs="+")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_runs_ingest)

    memory = sub.add_parser("memory", help="episodic memory").add_subparsers(dest="memory_command", required=True)
    p = memory.add_parser("status", help="provider, contract, state, counts, pending")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_status)

    p = memory.add_parser("episodes", help="list episodes, or show one by id")
    p.add_argument("episode_id", nargs="?")
    p.add_argument("--harness")
    p.add_argument("--repo")
    p.add_argument("--since", help="a duration back from now (7d, 12h) or an RFC 3339 time")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_episodes)

    p = memory.add_parser("recall", help="recall as a repository or harness would")
    p.add_argument("query")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--repo")
    who.add_argument("--as", dest="as_harness", metavar="HARNESS")
    p.add_argument("--paths", nargs="+", metavar="P")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_recall)

    p = memory.add_parser("briefing", help="preview the briefing a harness would receive now")
    p.add_argument("harness")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_briefing)
    _providers(sub, memory)
    _feeds(sub)
    register_agent_commands(sub)  # token mint, mcp-config, hook claude-code session-end (cli_agents.py)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except RpcError as exc:
        print(f"memactors: {exc.code}: {exc.message}", file=sys.stderr)
        return 2
    except (ConfigError, MemactorsError) as exc:
        print(f"memactors: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `memactors ... | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
