"""The `memactors` command line. Every operator command goes through MemoryService over the websocket
RPC (the CLI has no private path); `--json` prints the raw result for scripts.

The CLI finds the daemon the way the daemon finds its state: `--config`, else `$HARNESS_CONFIG`, else
`~/.config/harness/harness.toml`; the state directory named there holds `daemon.json` (the addresses
actually bound) and the operator token files.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from .config import Config, load_config
from .daemon import read_daemon_file, serve_main
from .errors import ConfigError, MemactorsError
from .rpc import RpcError, connect_rpc, read_token

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memactors", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="global harness.toml (default: $HARNESS_CONFIG or ~/.config/harness/harness.toml)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the daemon in the foreground")
    p.set_defaults(fn=cmd_serve)

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


if __name__ == "__main__":
    sys.exit(main())
