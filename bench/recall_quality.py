"""Recall quality on the real history of two public projects, through the surfaces an agent and an
operator use (issue 17).

    git clone https://github.com/encode/httpx /tmp/httpx
    git clone https://github.com/python-attrs/attrs /tmp/attrs
    .venv/bin/python bench/recall_quality.py /tmp/httpx /tmp/attrs            # the figures
    .venv/bin/python bench/recall_quality.py /tmp/httpx /tmp/attrs --json out.json
    .venv/bin/python bench/recall_quality.py /tmp/httpx /tmp/attrs --direct   # ranking only, in-process (quick)

Each repository path is a clone (a bare one will do) whose `origin` is the project named in
`bench/data/recall_questions.json` (the order of the paths is that of its `repos`). The questions were
written against the history as it stood in December 2026; a later clone only adds commits after them.

**Run records.** Every commit but merges becomes one closed run record, oldest first: the commit message
is the result text, each changed file one edit event, started_at the author date and ended_at the
commit date (both in UTC), the repository key and default branch in its one session. The commit's
author picks one of five harnesses per repository (`<name>-fixer`, `-docs`, `-triage`, `-refactor`,
`-deps`; adapters claude-code and codex alternate). A commit that a later commit reverts ("This reverts
commit <sha>") ended `failed` (`verify_failed`); every other one `succeeded`. The newest HOLDOUT (30)
commits of each repository are not ingested: they are "the upcoming work" of the briefing check.

**Through the daemon.** A `memactors serve` subprocess on a fresh state directory (built-in provider,
no model API, a `[harness.*]` table per harness); the records go in with `memactors runs ingest` (the
CLI, a subprocess, as JSON lines on its stdin). Then, for each harness, a run token minted (`MintRunToken`) whose workdir is a checkout with the project as its origin, on its
default branch (so the run's scope is the project's), and:

* **questions** (`bench/data/recall_questions.json`): each is asked through the gateway with that
  repository's run token — MCP `tools/call recall` over streamable HTTP with `mcp.Client`, limit 8 —
  and the episode items of the answer are read from the fenced document (run ids from the provenance
  lines). hit@1/3/8 and MRR (reciprocal rank of the first answering commit, 0 when none of the 8)
  for the questions in the commit's own words (`same`), in other words (`other`), and the path
  questions (the same questions with `paths`: one file the answering commit touched, preferring a
  non-test source file). Plus the share of returned items whose text contains the run's first line
  (its commit subject), and the median time of a gateway recall.
* **briefings**: each harness's default briefing (`briefing_max_chars = 2000`) through the gateway's
  `briefing` tool with its run token, and `memactors memory briefing <harness>` (the CLI): how many
  episodes each shows. Its picks — the provider's answer to REQ-14's episode query (repository,
  branch and harness name), as `Recall` with limit 3 over the operator RPC — are scored by whether
  each touched a file that the next 10 commits (the upcoming work) touch, against the harness's
  three newest runs.

`--direct` skips the daemon's surfaces for the questions and calls the built-in provider in-process on
the same store (same ranking, no REQ-9 filter or wrapper): for quick ranking experiments only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from user_paths import SERVICE, daemon, gateway_client  # noqa: E402

from memactors.rpc import connect_rpc  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "recall_questions.json"
ROLES = ("fixer", "docs", "triage", "refactor", "deps")
HOLDOUT = 30
UPCOMING = 10
LIMIT = 8
_REVERTS = re.compile(r"This reverts commit ([0-9a-f]{7,40})")
_RUN = re.compile(r"\brun ([0-9a-f]{8})\b")


@dataclass
class Commit:
    sha: str
    email: str
    started: str
    ended: str
    message: str
    files: list[str]
    failed: bool = False

    @property
    def run_id(self) -> str:
        return self.sha[:8]

    @property
    def subject(self) -> str:
        return self.message.strip().split("\n", 1)[0].strip()


@dataclass
class Repo:
    key: str
    branch: str
    path: str
    commits: list[Commit] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[1]

    def harness(self, commit: Commit) -> str:
        role = ROLES[int(hashlib.sha256(commit.email.lower().encode()).hexdigest(), 16) % len(ROLES)]
        return f"{self.name}-{role}"

    @property
    def harnesses(self) -> list[str]:
        return [f"{self.name}-{role}" for role in ROLES]


def _utc(stamp: str) -> str:
    return datetime.fromisoformat(stamp).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_commits(path: str) -> list[Commit]:
    """Non-merge commits, oldest first, with their changed files."""
    out = subprocess.run(
        ["git", "-C", path, "log", "--no-merges", "--reverse", "--format=%x1e%H%x1f%ae%x1f%aI%x1f%cI%x1f%B%x1d",
         "--name-only"], capture_output=True, text=True, check=True).stdout
    commits = []
    for chunk in out.split("\x1e")[1:]:
        head, _, names = chunk.partition("\x1d")
        sha, email, adate, cdate, body = head.split("\x1f", 4)
        files = list(dict.fromkeys(n.strip() for n in names.splitlines() if n.strip()))
        commits.append(Commit(sha, email, _utc(adate), _utc(cdate), body.strip(), files))
    reverted = {m.group(1) for c in commits for m in _REVERTS.finditer(c.message)}
    for c in commits:
        c.failed = any(c.sha.startswith(r) for r in reverted)
    return commits


def run_record(repo: Repo, c: Commit) -> dict[str, Any]:
    harness = repo.harness(c)
    codex = ROLES.index(harness.rsplit("-", 1)[1]) % 2 == 1
    ended = max(c.ended, c.started)
    duration = int((datetime.fromisoformat(ended) - datetime.fromisoformat(c.started)).total_seconds() * 1000)
    return {
        "harness": harness, "adapter": "codex" if codex else "claude-code", "run_id": c.run_id, "trace_id": c.sha,
        "started_at": c.started, "ended_at": ended, "duration_ms": min(max(duration, 0), 2_678_400_000),
        "cost_usd": None, "cost_source": "unknown",
        "model": {"served": "gpt-5-codex" if codex else "claude-sonnet-4-5"},
        "outcome": "failed" if c.failed else "succeeded", "reason": "verify_failed" if c.failed else "completed",
        "result_text": c.message, "trigger": {"source": "manual"}, "spawned_process": True,
        "sessions": [{"session_id": "s1", "subagent": False, "cwd": f"/srv/checkouts/{repo.name}", "repo": repo.key,
                      "git_branch": repo.branch, "started_at": c.started}],
        "events": [{"kind": "edit", "session_id": "s1", "at": c.started, "path": f} for f in c.files[:1000]],
    }


# -- questions -----------------------------------------------------------------------------------------

def load_questions() -> dict[str, Any]:
    return json.loads(DATA.read_text(encoding="utf-8"))


def path_for(commit: Commit) -> str | None:
    """The file a developer would name: the commit's first non-test module (not a version file, an
    `__init__.py` last), else its first file."""
    source = [f for f in commit.files if f.endswith(".py") and "test" not in f and "__version__" not in f]
    source.sort(key=lambda f: f.endswith("__init__.py"))  # a module over the package's __init__
    return (source or commit.files or [None])[0]


def write_path_questions(repos: Sequence[Repo]) -> None:
    """Add (or refresh) the path questions: each NL question again, with `paths` one file its first
    answering commit touched."""
    data = load_questions()
    by_run = {c.run_id: c for r in repos for c in r.commits}
    nl = [q for q in data["questions"] if q["kind"] in ("same", "other")]
    paths = []
    for q in nl:
        commit = by_run[q["answers"][0]]
        p = path_for(commit)
        if p:
            paths.append({**q, "kind": "path", "of": q["kind"], "paths": [p]})
    data["questions"] = nl + paths
    DATA.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(paths)} path questions written to {DATA}")


def episode_runs(document: str) -> list[tuple[str, str]]:
    """(run id, item text) of each episode item of a wrapper document, in order."""
    m = re.match(r'<memory-data kind="\w+" nonce="([0-9a-f]{16})"', document)
    if not m:
        return []
    nonce = m.group(1)
    out = []
    # the opening line is `<item nonce="N" …>` or (since the briefing work of issue 17) `<item …>`
    pattern = rf'(- episode [^\n]*)\n<item(?: nonce="{nonce}")?[^>\n]*>\n(.*?)\n</item nonce="{nonce}">'
    for item in re.finditer(pattern, document, re.S):
        run = _RUN.search(item.group(1))
        out.append((run.group(1) if run else "?", item.group(2)))
    return out


@dataclass
class Scores:
    n: int = 0
    hits: dict[int, int] = field(default_factory=lambda: {1: 0, 3: 0, 8: 0})
    rr: float = 0.0
    items: int = 0
    first_line: int = 0
    misses: list[str] = field(default_factory=list)

    def add(self, q: dict[str, Any], found: list[tuple[str, str]], subjects: dict[str, str]) -> None:
        self.n += 1
        runs = [r for r, _ in found]
        rank = next((i + 1 for i, r in enumerate(runs) if r in q["answers"]), None)
        for k in self.hits:
            self.hits[k] += rank is not None and rank <= k
        self.rr += 1 / rank if rank else 0.0
        if rank is None:
            self.misses.append(q["query"])
        for run, text in found:
            self.items += 1
            subject = " ".join(subjects.get(run, "").split())
            self.first_line += bool(subject) and subject in " ".join(text.split())

    def row(self) -> dict[str, Any]:
        return {"n": self.n, **{f"hit@{k}": round(v / max(self.n, 1), 3) for k, v in self.hits.items()},
                "mrr": round(self.rr / max(self.n, 1), 3), "items": self.items,
                "first_line": round(self.first_line / max(self.items, 1), 3)}


# -- the run --------------------------------------------------------------------------------------------

def machine() -> str:
    load = os.getloadavg()
    return (f"{platform.machine()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · "
            f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def config_for(root: Path, state: Path, repos: Sequence[Repo]) -> Path:
    tables = "".join(f'[harness.{h}]\nharness = "{"codex" if i % 2 else "claude-code"}"\n'
                     for r in repos for i, h in enumerate(r.harnesses))
    path = root / "harness.toml"
    path.write_text(f'[store]\npath = "{state}"\n[operator]\nlisten = "127.0.0.1:0"\n'
                    '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n'
                    '[memory.episodes]\nsummary = false\n' + tables, encoding="utf-8")
    return path


def cli(config: Path, root: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(root)}
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          check=False, input=stdin)


def touches(commit: Commit, upcoming: set[str]) -> bool:
    return bool(set(commit.files) & upcoming)


async def evaluate(repos: list[Repo], questions: list[dict[str, Any]], root: Path, *, direct: bool) -> dict[str, Any]:
    state = root / "state"
    config = config_for(root, state, repos)
    records = root / "records"
    records.mkdir(exist_ok=True)
    kept: dict[str, list[Commit]] = {}
    for r in repos:
        kept[r.key] = r.commits[:-HOLDOUT]
        with (records / f"{r.name}.jsonl").open("w", encoding="utf-8") as f:
            for c in kept[r.key]:
                f.write(json.dumps(run_record(r, c)) + "\n")
    subjects = {c.run_id: c.subject for r in repos for c in r.commits}
    out: dict[str, Any] = {"machine": machine(), "episodes": {r.key: len(kept[r.key]) for r in repos}}
    reuse = (state / "memactors.db").exists()
    async with daemon(root, config, state) as d, AsyncExitStack() as stack:
        t = time.perf_counter()
        if reuse:  # --keep on a state directory that has them already
            out["ingest"], out["ingest_s"] = "reused the kept state directory", 0.0
        else:
            lines = "".join(p.read_text(encoding="utf-8") for p in sorted(records.glob("*.jsonl")))
            ingest = await trio.to_thread.run_sync(lambda: cli(config, root, "runs", "ingest", "-", stdin=lines))
            out["ingest_s"] = round(time.perf_counter() - t, 1)
            out["ingest"] = ingest.stdout.strip().splitlines()[-1] if ingest.stdout.strip() else ingest.stderr[-300:]
        control = await stack.enter_async_context(connect_rpc(d["operator"], d["control"]))
        with trio.fail_after(600):
            while True:
                pending = (await control.call(f"{SERVICE}/Status", {}))["pending"]
                if not pending.get("records"):
                    break
                await trio.sleep(0.5)
        tokens: dict[str, str] = {}
        for r in repos:
            # A fresh run's place is its workdir's before its first session (REQ-9): a checkout whose
            # origin is the project, on its default branch. (Live presence would do too, but five
            # harnesses present on one branch are collisions, which a briefing shows first.)
            checkout = root / "checkouts" / r.name
            if not checkout.exists():
                checkout.mkdir(parents=True)
                for argv in (["init", "-q", "-b", r.branch], ["remote", "add", "origin", f"https://{r.key}.git"],
                             ["-c", "user.name=eval", "-c", "user.email=eval@example.invalid", "commit", "-q",
                              "--allow-empty", "-m", "eval"]):
                    await trio.run_process(["git", "-C", str(checkout), *argv], capture_stdout=True)
            for h in r.harnesses:
                tokens[h] = (await control.call(f"{SERVICE}/MintRunToken", {
                    "harness": h, "run_id": f"eval-{h}", "workdir": str(checkout)}))["token"]
        scores = {k: Scores() for k in ("same", "other", "path")}
        times: list[float] = []
        if direct:
            from memactors.builtin import BuiltinProvider
            from memactors.repo import scope_for
            from memactors.store import Store

            store = await Store.open(state / "memactors.db")
            stack.callback(store.close)
            provider = BuiltinProvider(store)
            for q in questions:
                args: dict[str, Any] = {"query": q["query"], "scope": [scope_for(q["repo"])], "limit": LIMIT}
                if q.get("paths"):
                    args["paths"] = q["paths"]
                t = time.perf_counter()
                items = (await provider.recall(args))["items"]
                times.append(time.perf_counter() - t)
                by_id = await store.read(lambda db, items=items: dict(db.execute(
                    f"SELECT episode_id, run_id FROM episodes WHERE episode_id IN ({','.join('?' * len(items))})",
                    [i["id"] for i in items]).fetchall()))
                scores[q["kind"]].add(q, [(by_id.get(i["id"], "?"), i["text"]) for i in items], subjects)
        else:
            clients = {}
            for r in repos:
                clients[r.key] = await stack.enter_async_context(gateway_client(d["gateway"], tokens[r.harnesses[0]]))
                await clients[r.key].call_tool("recall", {"query": "warm up", "limit": LIMIT})
            for q in questions:
                args = {"query": q["query"], "limit": LIMIT}
                if q.get("paths"):
                    args["paths"] = q["paths"]
                t = time.perf_counter()
                result = await clients[q["repo"]].call_tool("recall", args)
                times.append(time.perf_counter() - t)
                document = "".join(getattr(c, "text", "") for c in result.content)
                scores[q["kind"]].add(q, episode_runs(document), subjects)
        out["recall"] = {k: s.row() for k, s in scores.items()}
        nl = Scores()
        for k in ("same", "other"):
            s = scores[k]
            nl.n += s.n
            nl.rr += s.rr
            nl.items += s.items
            nl.first_line += s.first_line
            for h in nl.hits:
                nl.hits[h] += s.hits[h]
        out["recall"]["natural (same+other)"] = nl.row()
        out["recall_ms_p50"] = round(statistics.median(times) * 1000, 1)
        out["misses"] = {k: s.misses for k, s in scores.items()}

        # -- briefings --------------------------------------------------------------------------------
        briefings = []
        for r in repos:
            upcoming = {f for c in r.commits[-HOLDOUT:][:UPCOMING] for f in c.files}
            by_run = {c.run_id: c for c in kept[r.key]}
            for h in r.harnesses:
                mine = [c for c in kept[r.key] if r.harness(c) == h]
                newest = sorted(mine, key=lambda c: (c.started, c.run_id), reverse=True)[:3]
                query = " ".join((r.key, r.branch, h))
                ans = await control.call(f"{SERVICE}/Recall", {"query": query, "repo": r.key, "limit": 3})
                picks = [str(e.get("run_id", "?")) for e in ans.get("episodes", [])]
                async with gateway_client(d["gateway"], tokens[h]) as client:
                    doc = "".join(getattr(c, "text", "") for c in (await client.call_tool("briefing", {})).content)
                shown = episode_runs(doc)
                cli_doc = await trio.to_thread.run_sync(lambda h=h: cli(config, root, "memory", "briefing", h))
                briefings.append({
                    "repo": r.key, "harness": h, "runs": len(mine), "chars": len(doc),
                    "shown_gateway": len(shown), "shown_cli": len(episode_runs(cli_doc.stdout.strip())),
                    "picks": picks,
                    "picks_touch": sum(touches(by_run[p], upcoming) for p in picks if p in by_run),
                    "newest_touch": sum(touches(c, upcoming) for c in newest),
                    "first_line": sum(" ".join(by_run[run].subject.split()) in " ".join(text.split())
                                      for run, text in shown if run in by_run),
                })
        out["briefings"] = briefings
    return out


def report(out: dict[str, Any]) -> None:
    print(f"machine: {out['machine']}")
    print(f"episodes: {out['episodes']}  ingest: {out['ingest']} in {out['ingest_s']} s")
    print(f"{'questions':24} {'n':>4} {'hit@1':>6} {'hit@3':>6} {'hit@8':>6} {'MRR':>6} {'items':>6} {'1st line':>8}")
    for k, row in out["recall"].items():
        print(f"{k:24} {row['n']:>4} {row['hit@1']:>6.2f} {row['hit@3']:>6.2f} {row['hit@8']:>6.2f} {row['mrr']:>6.2f}"
              f" {row['items']:>6} {row['first_line']:>8.2f}")
    print(f"gateway recall p50: {out['recall_ms_p50']} ms")
    b = out.get("briefings", [])
    if b:
        print(f"{'briefing':34} {'runs':>5} {'chars':>6} {'shown gw/cli':>12} {'picks touch':>11} {'newest touch':>12}")
        for row in b:
            print(f"{row['harness']:34} {row['runs']:>5} {row['chars']:>6} {row['shown_gateway']:>6}/{row['shown_cli']:<5}"
                  f" {row['picks_touch']:>8}/{len(row['picks'])} {row['newest_touch']:>10}/3")
        print(f"picks touching the upcoming work: {sum(r['picks_touch'] for r in b)}/{sum(len(r['picks']) for r in b)}"
              f"; the three newest runs: {sum(r['newest_touch'] for r in b)}/{3 * len(b)};"
              f" briefings showing >= 2 episodes: {sum(r['shown_gateway'] >= 2 for r in b)}/{len(b)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="clones of the repositories, in the data file's order")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--direct", action="store_true", help="questions in-process (ranking experiments)")
    parser.add_argument("--keep", help="keep the state directory here (and reuse it, without ingesting, when it exists)")
    parser.add_argument("--write-path-questions", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="with --direct: set a constant of memactors.builtin (a Python literal), to try a change")
    parser.add_argument("--show-misses", action="store_true")
    args = parser.parse_args()
    data = load_questions()
    repos = [Repo(key, spec["branch"], path) for (key, spec), path in zip(data["repos"].items(), args.paths, strict=True)]
    for r in repos:
        r.commits = read_commits(r.path)
    if args.write_path_questions:
        write_path_questions(repos)
        return
    if args.set:
        import ast

        from memactors import builtin
        for assignment in args.set:
            name, _, value = assignment.partition("=")
            setattr(builtin, name, ast.literal_eval(value))
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="recall-quality-"))
    root.mkdir(parents=True, exist_ok=True)
    out = trio.run(lambda: evaluate(repos, data["questions"], root, direct=args.direct))
    report(out)
    if args.show_misses:
        for kind, misses in out["misses"].items():
            for q in misses:
                print(f"miss [{kind}] {q}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
