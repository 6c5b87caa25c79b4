"""Control-tier feeds for the neighbours recall and briefings read: `facts add`, `pr link`,
`presence report`, `vote`."""

from __future__ import annotations

import argparse
from typing import Any

from . import _core as core
from ._core import JSON_HELP, call


def cmd_facts_add(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"scope": args.scope, "text": args.text, "confidence": args.confidence,
                              "status": args.status}
    if args.id:
        params["id"] = args.id
    result = call(args, "AddFact", params, tier="control")
    core.print_json(result) if args.json else print(f"{result['id']} {result['status']} {result['scope']}")
    return 0


def cmd_pr_link(args: argparse.Namespace) -> int:
    result = call(args, "LinkPullRequest", {"repo": args.repo, "branch": args.branch, "url": args.url},
                  tier="control")
    core.print_json(result) if args.json else print(f"linked {result['url']} to {result['repo']}@{result['branch']}")
    return 0


def cmd_presence_report(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"harness": args.harness, "run_id": args.run, "session_id": args.session,
                              "repo": args.repo, "paths": args.paths or [], "ttl_seconds": args.ttl}
    if args.branch:
        params["branch"] = args.branch
    result = call(args, "ReportPresence", params, tier="control")
    core.print_json(result) if args.json else print(f"present until {result['expires_at']}")
    return 0


def cmd_vote(args: argparse.Namespace) -> int:
    result = call(args, "CastVote", {"fact_id": args.fact_id, "run_id": args.run, "harness": args.harness,
                                     "stance": args.stance}, tier="control")
    core.print_json(result) if args.json else print(
        f"vote {result['id']} on {result['fact_id']}: {'counted' if result['counted'] else 'stored, not counted'}")
    return 0


def register(sub: Any) -> None:
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
