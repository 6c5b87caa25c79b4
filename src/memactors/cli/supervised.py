"""Runs the daemon supervises: `run` (start one now, `--wait` to follow it) and `runs list`, `show`,
`wait`, `cancel`, `logs` (docs/runs.md). Each is one or more MemoryService calls (`StartRun`, `WaitRun`,
`ListRuns`, `GetRun`, `CancelRun`, `RunLogs`) over the standard-library client: blocking calls, so a
Ctrl-C interrupts a wait at once and the command decides what it means (the agent is the daemon's,
never this process's: it keeps running unless the operator cancels it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from . import _core as core
from ._core import EXIT_INTERRUPTED, EXIT_OK, JSON_HELP, SERVICE, CliError


class _Daemon:
    """The daemon as the run commands call it: the configuration, address and token read once, then one
    RPC per call over the standard-library client (blocking, so Ctrl-C interrupts a wait at once)."""

    def __init__(self, args: argparse.Namespace, tier: str) -> None:
        self.config = core.config_for(args, tier)
        self.url = core.operator_url(self.config)
        self.tier = tier
        self.token = core.token_for(self.config, tier)
        self._args = args

    def call(self, method: str, params: dict[str, Any]) -> Any:
        from ..rpc.wsclient import WsRpcError, call_once

        token = self.token
        if self.tier == "read" and method in _CONTROL_METHODS:
            token = core.token_for(self.config, "control")
        try:
            return call_once(self.url, token, f"{SERVICE}/{method}", params)
        except WsRpcError as exc:
            raise CliError(exc.code, f"{exc.code}: {exc.message}") from None

    def wait(self, run: dict[str, Any]) -> dict[str, Any]:
        """WaitRun until the run has ended and been recorded (each call waits up to 25 s)."""
        while run["state"] != "ended":
            run = self.call("WaitRun", {"run_id": run["run_id"], "harness": run["harness"], "wait_seconds": 25})
        return run


_CONTROL_METHODS = frozenset({"StartRun", "CancelRun"})


def _ref(run: dict[str, Any]) -> str:
    """How to name the run on a command line."""
    return f"{run['run_id']} --harness {run['harness']}"


def _still_running(run: dict[str, Any]) -> str:
    pid = f" (pid {run['pid']})" if run.get("pid") else ""
    return (f"memactors: run {run['run_id']} of {run['harness']} is still running{pid}; the daemon supervises it.\n"
            f"  follow it:  memactors runs wait {_ref(run)}\n"
            f"  its events: memactors runs logs {_ref(run)} --follow\n"
            f"  stop it:    memactors runs cancel {_ref(run)}")


def _outcome_line(run: dict[str, Any]) -> str:
    reason = run.get("reason") or ""
    if run.get("cap"):
        reason += f": {run['cap']} = {run.get(run['cap'])}"
    episode = run.get("episode_id") or f"no episode ({run.get('ingest')})"
    return f"run {run['run_id']}: {run['outcome']} ({reason}), {episode}"


def _report_failure(run: dict[str, Any]) -> None:
    """On stderr: why the agent could not run, and what it wrote on stderr (redacted) for a run that
    did not succeed, so a refused flag, a missing key or a crash says why."""
    if run.get("error"):
        print(f"memactors: the agent could not be started: {run['error']}", file=sys.stderr)
    if run.get("outcome") != "succeeded" and run.get("stderr_tail"):
        what = "produced no output" if run.get("reason") == "launch_failed" else "wrote on stderr"
        print(f"memactors: the agent {what}; its stderr (last 4 KiB, redacted):", file=sys.stderr)
        for line in run["stderr_tail"].rstrip("\n").splitlines():
            print(f"  {line}", file=sys.stderr)
    elif run.get("reason") == "launch_failed":
        print("memactors: the agent exited non-zero without output and wrote nothing on stderr", file=sys.stderr)


def _run_json(run: dict[str, Any]) -> dict[str, Any]:
    keys = ("run_id", "harness", "outcome", "reason", "cap", "episode_id", "stderr_tail")
    return {k: run.get(k) for k in keys}


def cmd_run(args: argparse.Namespace) -> int:
    """`memactors run H`: StartRun, then with --wait follow it (WaitRun) to its recorded end. Ctrl-C
    while waiting asks whether to cancel the run (on a terminal) or says how to get back to it."""
    import secrets
    from datetime import UTC, datetime

    from ..errors import exit_status

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
    # The run id is chosen here, so a Ctrl-C before the daemon answers still knows which run to name.
    params["run_id"] = f"r{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
    daemon = _Daemon(args, "control")
    try:
        run = daemon.call("StartRun", params)
    except KeyboardInterrupt:
        ref = f"{params['run_id']} --harness {args.harness}"
        print(f"memactors: interrupted while the run was starting; it may be running: "
              f"memactors runs show {ref} (stop it with memactors runs cancel {ref})", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not args.json:
        pid = f", pid {run['pid']}" if run.get("pid") else ""
        print(f"run {run['run_id']} of {run['harness']} started ({run['adapter']}{pid})", flush=True)
    if not args.wait:
        if args.json:
            core.print_json(_run_json(run))
        return EXIT_OK
    try:
        run = daemon.wait(run)
    except KeyboardInterrupt:
        return _interrupted(daemon, run, args)
    return _finish(run, args, exit_status)


def _finish(run: dict[str, Any], args: argparse.Namespace, exit_status: Any) -> int:
    if args.json:
        core.print_json(_run_json(run))
    else:
        print(_outcome_line(run))
    _report_failure(run)
    return int(exit_status(run["outcome"]))


def _interrupted(daemon: _Daemon, run: dict[str, Any], args: argparse.Namespace) -> int:
    """Ctrl-C on `run --wait`: the agent is the daemon's, not this process's, so it keeps running unless
    the operator says to stop it. On a terminal, ask; otherwise say how to re-attach and how to cancel."""
    from ..errors import exit_status

    print(file=sys.stderr)
    if sys.stdin.isatty():
        sys.stderr.write(f"Cancel run {run['run_id']} of {run['harness']}? Otherwise it keeps running. [y/N] ")
        sys.stderr.flush()
        try:
            answer = sys.stdin.readline().strip().lower()
        except KeyboardInterrupt:
            answer = ""
        if answer in ("y", "yes"):
            try:
                run = daemon.wait(daemon.call("CancelRun", {"run_id": run["run_id"], "harness": run["harness"]}))
            except KeyboardInterrupt:
                print(_still_running(run), file=sys.stderr)
                return EXIT_INTERRUPTED
            return _finish(run, args, exit_status)
    print(_still_running(run), file=sys.stderr)
    return EXIT_INTERRUPTED


# -- the runs group: list, show, wait, cancel, logs -------------------------------------------------------

def _when(text: str | None) -> str:
    return "-" if not text else text[:19].replace("T", " ")


def _duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def cmd_runs_list(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {k: v for k, v in {"harness": args.harness, "state": args.state,
                                                "after": args.after}.items() if v}
    params["limit"] = args.limit
    result = _Daemon(args, "read").call("ListRuns", params)
    if args.json:
        core.print_json(result)
        return EXIT_OK
    rows = result["runs"]
    if not rows:
        print("no runs")
        return EXIT_OK
    print(f"{'RUN':<24} {'HARNESS':<16} {'STATE':<8} {'OUTCOME':<28} {'STARTED':<19} {'TIME':>7}  EPISODE")
    for r in rows:
        outcome = "-" if r["state"] == "running" else f"{r['outcome']} ({r['reason']})"
        print(f"{r['run_id']:<24} {r['harness']:<16} {r['state']:<8} {outcome:<28} {_when(r['started_at']):<19} "
              f"{_duration(r.get('duration_ms')):>7}  {r.get('episode_id') or '-'}")
    line = f"-- {len(rows)} shown of {result['total']}"
    if result.get("next_cursor"):
        line += f"; next page: --after '{result['next_cursor']}'"
    print(line)
    return EXIT_OK


def _show(run: dict[str, Any]) -> None:
    print(f"run         {run['run_id']}  (harness {run['harness']}, adapter {run['adapter']})")
    pid = "" if not run.get("pid") else f", pid {run['pid']}" if run["state"] == "running" else f" (was pid {run['pid']})"
    print(f"state       {run['state']}{pid}")
    print(f"started     {run['started_at']}")
    if run["state"] == "ended":
        print(f"ended       {run.get('ended_at')}  ({_duration(run.get('duration_ms'))})")
        reason = run.get("reason") or ""
        stopped = {"cancel": "memactors runs cancel", "operator_cancel": "the daemon stopping",
                   "deadline": "the timeout"}.get(run.get("stopped_by") or "")
        print(f"outcome     {run['outcome']} ({reason})" + (f", stopped by {stopped}" if stopped else ""))
        if run.get("exit_code") is not None:
            print(f"exit code   {run['exit_code']}")
        episode = run.get("episode_id") or "none"
        print(f"episode     {episode} ({run.get('ingest')})")
    caps = [f"{k} {run[k]:g}" for k in ("max_turns", "max_cost_usd") if run.get(k) is not None]
    used = [f"{run['turns']} turns" if run.get("turns") else "",
            f"${run['cost_usd']:g} reported" if run.get("cost_usd") is not None else ""]
    if caps or any(used):
        line = ", ".join(u for u in used if u) or "nothing reported"
        if caps:
            line += f"  (caps: {', '.join(caps)})"
        print(f"used        {line}")
    if run.get("cap"):
        print(f"cap reached {run['cap']} = {run.get(run['cap'])}")
    if run.get("error"):
        print(f"error       {run['error']}")
    if run.get("stderr_tail"):
        print("stderr      (last 4 KiB, redacted)")
        for line in run["stderr_tail"].rstrip("\n").splitlines():
            print(f"  {line}")


def cmd_runs_show(args: argparse.Namespace) -> int:
    run = _Daemon(args, "read").call("GetRun", {"run_id": args.run, "harness": args.harness})
    if args.json:
        core.print_json(run)
    else:
        _show(run)
    return EXIT_OK


def cmd_runs_wait(args: argparse.Namespace) -> int:
    from ..errors import exit_status

    daemon = _Daemon(args, "read")
    run = daemon.call("GetRun", {"run_id": args.run, "harness": args.harness})
    try:
        run = daemon.wait(run)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        print(_still_running(run), file=sys.stderr)
        return EXIT_INTERRUPTED
    return _finish(run, args, exit_status)


def cmd_runs_cancel(args: argparse.Namespace) -> int:
    daemon = _Daemon(args, "control")
    run = daemon.call("CancelRun", {"run_id": args.run, "harness": args.harness})
    if run["state"] == "ended":  # CancelRun answers a running run as still running (the stop is asked)
        print(f"memactors: run {run['run_id']} had already ended: {run['outcome']} ({run['reason']})",
              file=sys.stderr)
    elif not args.no_wait:
        try:
            run = daemon.wait(run)
        except KeyboardInterrupt:
            print(file=sys.stderr)
            print(f"memactors: run {run['run_id']} is being stopped; memactors runs wait {_ref(run)} follows it",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
    if args.json:
        core.print_json(run)
    elif run["state"] == "ended":
        print(_outcome_line(run))
    else:
        print(f"run {run['run_id']}: stopping (SIGTERM, then SIGKILL after the grace)")
    return EXIT_OK


def _event_line(event: dict[str, Any]) -> str:
    at, kind = _when(event.get("at"))[11:], event.get("kind")
    match kind:
        case "session":
            text = f"session {event.get('session_id')} (model {event.get('model')})"
        case "tool":
            text = f"tool    {event.get('name')}"
        case "edit":
            text = f"edit    {event.get('path')}"
        case "command":
            code = event.get("exit_code")
            status = "not run (refused or unfinished)" if code is None else f"exit {code}"
            text = f"$ {event.get('command')}  -> {status}"
        case "text":
            text = "says    " + str(event.get("text", "")).replace("\n", "\n" + " " * 17)
        case "result":
            cost = f", ${event['cost_usd']:g}" if event.get("cost_usd") is not None else ""
            turns = f", {event['turns']} turns" if event.get("turns") else ""
            text = f"result  {'ok' if event.get('ok') else 'error'} {event.get('subtype') or ''}{cost}{turns}"
        case _:
            text = f"{kind:<7} {event.get('text', '')}"
    return f"{at}  {text}"


def cmd_runs_logs(args: argparse.Namespace) -> int:
    import json as _json

    daemon = _Daemon(args, "read")
    after, shown_gap = 0, False
    try:
        while True:
            page = daemon.call("RunLogs", {"run_id": args.run, "harness": args.harness, "after": after,
                                           "wait_seconds": 25 if args.follow else 0})
            if not page["kept"]:
                print(f"memactors: the log of run {page['run_id']} is no longer kept (pruned, or its episode "
                      "was forgotten)", file=sys.stderr)
                return EXIT_OK
            if page["dropped"] and not shown_gap and page["events"] and page["events"][0]["seq"] > after + 1:
                print(f"memactors: {page['dropped']} earlier event(s) no longer kept", file=sys.stderr)
                shown_gap = True
            for event in page["events"]:
                print(_json.dumps(event, sort_keys=True) if args.json else _event_line(event), flush=True)
            after = page["next"]
            if not args.follow or (page["state"] == "ended" and not page["events"]):
                return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def register_run(sub: Any) -> None:
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
    p.add_argument("--wait", action="store_true",
                   help="follow the run until it is recorded; exit with its outcome. Ctrl-C asks whether to cancel "
                        "the run (on a terminal) or prints how to re-attach and cancel it")
    p.add_argument("--json", action="store_true",
                   help="print {run_id, harness, outcome, reason, cap, episode_id, stderr_tail}")
    p.set_defaults(fn=cmd_run)


def register_watch(runs: Any) -> None:
    def named(p: argparse.ArgumentParser) -> None:
        p.add_argument("run", help="the run id (as `memactors run` printed it)")
        p.add_argument("--harness", metavar="H", help="the harness, when more than one used this run id")

    p = runs.add_parser("list", help="runs the daemon started, newest first (read tier)",
                        description="List the runs `memactors run` started on this daemon, running and ended "
                                    "(ended runs are kept 30 days, across restarts).")
    p.add_argument("--harness", metavar="H", help="only runs of this harness")
    p.add_argument("--state", choices=("running", "ended"), help="only running or only ended runs")
    p.add_argument("--limit", type=core.positive, default=50, metavar="N", help="runs per page (default 50, at most 1000)")
    p.add_argument("--after", metavar="CURSOR", help="the next page (the cursor the previous page printed)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_runs_list)

    p = runs.add_parser("show", help="one run: state, pid, times, outcome, episode, stderr tail (read tier)",
                        description="Show one run: its state and pid, times, outcome and reason (and the cap "
                                    "that stopped it), its episode, and the last 4 KiB of the agent's stderr, "
                                    "redacted.")
    named(p)
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_runs_show)

    p = runs.add_parser("wait", help="wait for a run to end; exit with its outcome (read tier)",
                        description="Wait until the run has ended and been recorded, then print its outcome.",
                        epilog="Exit status: 0 succeeded, 1 failed, 12 timed_out, 13 cancelled, 14 crashed; "
                               "130 when interrupted (the run keeps running).")
    named(p)
    p.add_argument("--json", action="store_true", help="print {run_id, harness, outcome, reason, cap, "
                                                       "episode_id, stderr_tail}")
    p.set_defaults(fn=cmd_runs_wait)

    p = runs.add_parser("cancel", help="stop a running run; it is still recorded (control tier)",
                        description="Stop a running run: SIGTERM to its process group, SIGKILL after the grace. "
                                    "It is recorded as cancelled (operator_cancel), with its episode. Waits "
                                    "until it is recorded unless --no-wait.")
    named(p)
    p.add_argument("--no-wait", action="store_true", help="return once the stop is asked for")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(fn=cmd_runs_cancel)

    p = runs.add_parser("logs", help="a run's events as the agent's stream was parsed, redacted (read tier)",
                        description="Print the run's events: session, tool calls, edits, shell commands with "
                                    "their exit status, the agent's words, its result (cost, turns), and the "
                                    "daemon's notes. Redacted and bounded: the last 500 events, kept 7 days "
                                    "after the run (docs/runs.md).")
    named(p)
    p.add_argument("--follow", "-f", action="store_true", help="keep printing events until the run ends")
    p.add_argument("--json", action="store_true", help="one JSON object per event")
    p.set_defaults(fn=cmd_runs_logs)
