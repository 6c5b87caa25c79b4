"""Recall quality on the real history of two public projects, through the surfaces an agent and an
operator use.

    git clone https://github.com/encode/httpx /tmp/httpx
    git clone https://github.com/python-attrs/attrs /tmp/attrs
    git clone https://github.com/psf/black /tmp/black                          # optional: the check-only corpus
    .venv/bin/python bench/recall_quality.py /tmp/httpx /tmp/attrs /tmp/black  # the figures
    .venv/bin/python bench/recall_quality.py /tmp/httpx /tmp/attrs --json out.json
    .venv/bin/python bench/recall_quality.py /tmp/httpx /tmp/attrs --direct   # ranking only, in-process (quick)

Each repository path is a clone (a bare one will do) of a project named in
`bench/data/recall_questions.json`, in the order of its `repos`; the last ones may be left out (their
questions are then skipped). The questions were written against the histories as they stood in
December 2026; a later clone only adds commits after them.

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
  per group: in the commit's own words (`same`), in other words — the `hard` set (at most one content
  word of the subject) and the `natural` set (a developer's own phrasing, sharing a word or two) —,
  the path questions (the `same` and `hard` questions with `paths`: one file the answering commit
  touched, preferring a non-test source file), and psf/black's `same` and `other` questions (a third
  project, for checking only). Each httpx/attrs group is also reported in two halves, `tune` and
  `check` (by a hash of the question's text): ranking changes were tuned on the first only. The two
  held-out other-words sets (`heldout_other_words.json`, `heldout2_other_words.json`) were written by
  separate writers from the commits alone; the second after the fusion was chosen, read by no
  tuning (`bench/fusion_sweep.py` leaves it out), and reported in its own row only. Plus the
  share of returned items whose text contains the run's first line (its commit subject), and the median
  time of a gateway recall.
* **briefings**: each harness's default briefing (`briefing_max_chars = 2000`) through the gateway's
  `briefing` tool with its run token, and `memactors memory briefing <harness>` (the CLI): how many
  episodes each shows, per surface. Each bench run mints its tokens for fresh run ids: a run's briefing
  is computed at its first read and then served unchanged for that run (REQ-15), so a run id reused on
  a `--keep` state directory would be served the briefing an earlier build computed (the "1 through the
  gateway, 2 through `memory briefing`" of the first pass was exactly that). Its picks — the provider's answer to REQ-14's episode query (repository,
  branch and harness name), as `Recall` with limit 3 over the operator RPC — are scored by whether
  each touched a file that the next 10 commits (the upcoming work) touch, against the harness's
  three newest runs; and whether each touched a file of the harness's own next runs (its
  commits among the held-out ones), against the same three, and how many pairs of a repository's
  harnesses got different picks.

`--direct` skips the daemon's surfaces for the questions and calls the built-in provider in-process on
the same store (same ranking, no REQ-9 filter or wrapper): for quick ranking experiments only.
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from user_paths import SERVICE, daemon, gateway_client  # noqa: E402

from memactors.rpc.client import connect_rpc  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "recall_questions.json"
CHANGELOG_DATA = DATA.with_name("changelog_questions.json")
#: Questions in other words written by a separate writer, given only the commits, who never saw the
#: ranking code: a check set that no tuning reads.
HELDOUT_DATA = DATA.with_name("heldout_other_words.json")
#: A second such set, written the same way after the fusion was chosen by
#: bench/fusion_sweep.py, which had read the first one: the check set no tuning has read. fusion_sweep
#: leaves it out.
HELDOUT2_DATA = DATA.with_name("heldout2_other_words.json")
#: Questions with no answer in the history: a recall should answer each with nothing.
NOANSWER_DATA = DATA.with_name("noanswer_questions.json")
#: A second no-answer set, 30 per project, written blind by another engineer
#: after the floor's model was fitted on the first: judged on, never tuned on (bench/floor_sweep.py
#: leaves it out), reported in its own row.
NOANSWER_HELDOUT_DATA = DATA.with_name("noanswer_heldout.json")
#: A third no-answer set, written blind by another engineer while the score model
#: that the first two were fitted into was being built, opened only once that model was final: judged on,
#: never tuned on (bench/floor_sweep.py leaves it out), reported in its own row.
NOANSWER_HELDOUT2_DATA = DATA.with_name("noanswer_heldout2.json")
#: A fourth no-answer set, written blind by another engineer while recall's
#: embedding of its unembedded candidates was being built, opened once that ranking was final and
#: committed, run once: judged on, never tuned on (bench/floor_sweep.py leaves it out), its own row.
NOANSWER_HELDOUT3_DATA = DATA.with_name("noanswer_heldout3.json")
#: A fifth no-answer set and a third held-out other-words set, written blind by another engineer while
#: the score was being searched for a signal that tells those writers' no-answer questions apart,
#: copied in unread once that search was over and its ranking committed, run once: judged on, never
#: tuned on (bench/floor_sweep.py leaves them out), each in its own row.
NOANSWER_HELDOUT4_DATA = DATA.with_name("noanswer_heldout4.json")
HELDOUT3_DATA = DATA.with_name("heldout3_other_words.json")
#: The modes one run compares: BM25 alone ([memory] embeddings = false) and the default configuration
#: (the embedded model, hybrid ranking); `fresh` is the default configuration asked as soon as `runs
#: ingest` has returned and every record is recorded, while the vectors are still being back-filled
#: (what an agent meets right after an import).
MODES = ("bm25", "embedded")
#: Path questions labelled by recency: the answers are the RECENT newest ingested runs that touched the path.
RECENT = 3
ROLES = ("fixer", "docs", "triage", "refactor", "deps")
#: Report groups, in order: (kind, set) -> name.
GROUPS = {("same", "first"): "same", ("other", "hard"): "other (hard)", ("other", "natural"): "other (natural)",
          ("path", "first"): "path", ("path", "hard"): "path", ("same", "black"): "black same",
          ("other", "black"): "black other", ("other", "heldout"): "heldout other words",
          ("other", "heldout2"): "heldout-2 other words (untuned)",
          ("other", "heldout3"): "heldout-3 other words (blind)",
          ("path-recency", "first"): "path (recency)", ("path-recency", "hard"): "path (recency)",
          ("none", "noanswer"): "no answer (MRR: share answered with nothing)",
          ("none", "noanswer_heldout"): "no answer, held-out (untuned; share answered with nothing)",
          ("none", "noanswer_heldout2"): "no answer, held-out 2 (blind; share answered with nothing)",
          ("none", "noanswer_heldout3"): "no answer, held-out 3 (blind; share answered with nothing)",
          ("none", "noanswer_heldout4"): "no answer, held-out 4 (blind; share answered with nothing)"}
#: The changelog questions' groups, by how many content words of the commit's subject they share.
CHANGELOG_GROUPS = ("changelog other (<= 1 shared)", "changelog some (2 shared)", "changelog same (>= 3 shared)")
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

def load_questions(*, changelog: bool = False) -> dict[str, Any]:
    """The hand-written questions; with `changelog`, the changelog questions after them."""
    data = json.loads(DATA.read_text(encoding="utf-8"))
    for path, name in ((HELDOUT_DATA, "heldout"), (HELDOUT2_DATA, "heldout2"), (NOANSWER_DATA, "noanswer"),
                       (NOANSWER_HELDOUT_DATA, "noanswer_heldout"), (NOANSWER_HELDOUT2_DATA, "noanswer_heldout2"),
                       (NOANSWER_HELDOUT3_DATA, "noanswer_heldout3"), (HELDOUT3_DATA, "heldout3"),
                       (NOANSWER_HELDOUT4_DATA, "noanswer_heldout4")):
        if path.exists():
            data["questions"] += [{**q, "set": name} for q in json.loads(path.read_text(encoding="utf-8"))["questions"]]
    if changelog and CHANGELOG_DATA.exists():
        data["questions"] += json.loads(CHANGELOG_DATA.read_text(encoding="utf-8"))["questions"]
    return data


def group(q: dict[str, Any]) -> str:
    if q["kind"] == "changelog":
        name = CHANGELOG_GROUPS[min(max(q["shared"] - 1, 0), 2)]
        return f"black {name}" if q.get("set") == "black" else name
    return GROUPS[(q["kind"], q.get("set", "first"))]


def half(q: dict[str, Any]) -> str:
    """`tune` or `check`, fixed by the question's text; black's questions are all `check`."""
    if q.get("set") in ("black", "heldout", "heldout2", "heldout3", "noanswer_heldout", "noanswer_heldout2",
                        "noanswer_heldout3", "noanswer_heldout4"):
        return "check"
    return ("tune", "check")[hashlib.sha256(q["query"].encode()).digest()[0] % 2]


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
        if q.get("set") not in ("first", "hard"):  # the path set stays the first 64, to compare with main
            continue
        commit = by_run[q["answers"][0]]
        p = path_for(commit)
        if p:
            paths.append({**q, "kind": "path", "of": q["kind"], "paths": [p]})
    data["questions"] = nl + paths
    DATA.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(paths)} path questions written to {DATA}")


# -- the changelog questions ------------------------------------------------------------------------------

_REF = re.compile(r"#(\d+)")
_PLAIN = [(re.compile(p), r) for p, r in (
    (r"\[#?\d+\]\([^)]*\)", " "), (r"\[([^\]]*)\]\([^)]*\)", r"\1"), (r"\(#\d+(?:,\s*#\d+)*\)", " "), (r"#\d+", " "),
    (r"https?://\S+", " "), (r"[`*]", ""), (r"\s+", " "))]


def changelog_bullets(text: str) -> list[str]:
    """The bullets of a Markdown changelog, each with its continuation lines."""
    out: list[str] = []
    current: str | None = None
    for line in text.splitlines():
        if re.match(r"^\s{0,2}[-*] ", line):
            if current:
                out.append(current)
            current = line.strip()[2:]
        elif current is not None and line.strip() and line.startswith(" "):
            current += " " + line.strip()
        elif current is not None and (not line.strip() or line.startswith("#")):
            out.append(current)
            current = None
    if current:
        out.append(current)
    return out


def changelog_question(bullet: str) -> tuple[list[int], str]:
    """(the pull request / issue numbers a bullet names, its first sentence as plain text, at most 30
    words, without the numbers or links)."""
    refs = [int(n) for n in _REF.findall(bullet)]
    text = bullet
    for pattern, replacement in _PLAIN:
        text = pattern.sub(replacement, text)
    text = re.split(r"(?<=[a-z0-9)])\. ", text.strip())[0].rstrip(". ")
    return refs, " ".join(text.split()[:30])


def shared_words(query: str, subject: str) -> int:
    """How many content words of the commit's subject the question has (equal, or one starting the
    other, or the same first five letters: `gist.matches`)."""
    from memactors.builtin.ranking import STOPWORDS
    from memactors.documents import matches

    def content(t: str) -> set[str]:
        return {w for w in re.findall(r"[^\W_]+", t.lower()) if w not in STOPWORDS and not w.isdigit()}

    asked = content(query)
    return sum(1 for w in content(re.sub(r"\(#\d+\)", "", subject)) if matches(w, asked) or any(matches(a, [w]) for a in asked))


def write_changelog_questions(repos: Sequence[Repo]) -> None:
    """Questions from each project's own changelog: a bullet that names pull requests or issues asks
    for the commit(s) that made them — the subject carries "(#N)", or (attrs) the commit added the
    news fragment `changelog.d/N.*` (a commit adding more than two fragments is a release or a
    conversion, not the change). The maintainers' words for a change, written apart from its commit
    message: paraphrases in quantity, none written by us. Only commits that are ingested (not the
    held-out newest 30) answer; a bullet that more than three commits answer is left out."""
    data = load_questions()
    out: list[dict[str, Any]] = []
    for r in repos:
        name = data["repos"][r.key]["changelog"]
        text = subprocess.run(["git", "-C", r.path, "show", f"HEAD:{name}"], capture_output=True, text=True,
                              check=True).stdout
        log = subprocess.run(["git", "-C", r.path, "log", "--no-merges", "--format=%x1e%H", "--name-status"],
                             capture_output=True, text=True, check=True).stdout
        added = {}
        for chunk in log.split("\x1e")[1:]:
            sha, _, names = chunk.partition("\n")
            added[sha.strip()] = [n.split("\t")[-1] for n in names.splitlines() if n.startswith("A\t")]
        kept = r.commits[:-HOLDOUT]
        seen: set[str] = set()
        for bullet in changelog_bullets(text):
            refs, query = changelog_question(bullet)
            if not refs or len(query.split()) < 4 or query in seen:
                continue
            answers = []
            for c in kept:
                fragments = [f for f in added.get(c.sha, []) if f.startswith("changelog.d/")]
                if any(f"(#{n})" in c.subject for n in refs) or (len(fragments) <= 2 and any(
                        re.fullmatch(rf"changelog\.d/{n}\.\w+\.(md|rst)", f) for f in fragments for n in refs)):
                    answers.append(c.run_id)
            if not answers or len(answers) > 3:
                continue
            seen.add(query)
            subject = next(c.subject for c in kept if c.run_id == answers[0])
            out.append({"repo": r.key, "kind": "changelog", "set": "black" if r.key.endswith("/black") else "tune",
                        "query": query, "answers": answers, "shared": shared_words(query, subject)})
    CHANGELOG_DATA.write_text(json.dumps({"about": (
        "Questions from each project's changelog (bench/recall_quality.py --write-changelog-questions): a bullet"
        " naming pull requests asks for the commits that made them; 'shared' counts the content words of the"
        " answer's subject the question has. httpx and attrs: the set ranking changes were tuned on; black:"
        " checking only."), "questions": out}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(out)} changelog questions written to {CHANGELOG_DATA}")


def episode_runs(document: str) -> list[tuple[str, str]]:
    """(run id, item text) of each episode item of a wrapper document, in order."""
    m = re.match(r'<memory-data kind="\w+" nonce="([0-9a-f]{16})"', document)
    if not m:
        return []
    nonce = m.group(1)
    out = []
    # the opening line is `<item nonce="N" …>` or (since the nonce left the opening line) `<item …>`
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
        if not q["answers"]:  # a no-answer question: "hit" is answering with nothing
            for k in self.hits:
                self.hits[k] += not found
            self.rr += not found
            self.items += len(found)
            if found:
                self.misses.append(q["query"])
            return
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


def config_for(root: Path, state: Path, repos: Sequence[Repo], mode: str = "embedded",
               store_url: str | None = None) -> Path:
    """The daemon's configuration for `mode`; with `store_url`, the store in that PostgreSQL database
    (pgvector) instead of the SQLite file."""
    tables = "".join(f'[harness.{h}]\nharness = "{"codex" if i % 2 else "claude-code"}"\n'
                     for r in repos for i, h in enumerate(r.harnesses))
    path = root / f"harness-{mode}.toml"
    memory = "[memory]\nembeddings = false\n" if mode == "bm25" else ""
    url = f'url = "{store_url}"\n' if store_url else ""
    path.write_text(f'[store]\npath = "{state}"\n{url}[operator]\nlisten = "127.0.0.1:0"\n'
                    '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n'
                    f'{memory}[memory.episodes]\nsummary = false\n' + tables, encoding="utf-8")
    return path


def recency_questions(repos: Sequence[Repo], kept: dict[str, list[Commit]],
                      questions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The path questions again, labelled by recency: what answers them is the RECENT newest
    ingested runs that touched the path, what an agent about to edit it needs."""
    out = []
    for q in questions:
        if q["kind"] != "path":
            continue
        runs = sorted((c for c in kept[q["repo"]] if set(q["paths"]) & set(c.files)),
                      key=lambda c: (c.started, c.run_id), reverse=True)[:RECENT]
        if runs:
            out.append({**q, "kind": "path-recency", "answers": [c.run_id for c in runs]})
    return out


def cli(config: Path, root: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(root)}
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          check=False, input=stdin)


def touches(commit: Commit, upcoming: set[str]) -> bool:
    return bool(set(commit.files) & upcoming)


async def evaluate(repos: list[Repo], questions: list[dict[str, Any]], root: Path, *, direct: bool,
                   mode: str = "embedded", briefings_wanted: bool = True,
                   store_url: str | None = None) -> dict[str, Any]:
    state = root / f"state-{mode}"
    config = config_for(root, state, repos, "embedded" if mode == "fresh" else mode, store_url)
    records = root / "records"
    records.mkdir(exist_ok=True)
    kept: dict[str, list[Commit]] = {}
    for r in repos:
        kept[r.key] = r.commits[:-HOLDOUT]
        with (records / f"{r.name}.jsonl").open("w", encoding="utf-8") as f:
            for c in kept[r.key]:
                f.write(json.dumps(run_record(r, c)) + "\n")
    subjects = {c.run_id: c.subject for r in repos for c in r.commits}
    questions = [*questions, *recency_questions(repos, kept, questions)]
    out: dict[str, Any] = {"machine": machine(), "mode": mode, "store": "postgresql" if store_url else "sqlite",
                           "episodes": {r.key: len(kept[r.key]) for r in repos}}
    reuse = (state / "memactors.db").exists()
    run_tag = f"{int(time.time()):x}"  # fresh run ids: a run's briefing is computed at its first read (REQ-15)
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
        out["recorded_s"] = round(time.perf_counter() - t, 1)
        if mode == "embedded":  # the background embedder's back-fill, timed from the ingest's start
            with trio.fail_after(3600):
                while True:
                    emb = (await control.call(f"{SERVICE}/Status", {}))["embeddings"] or {}
                    if not emb.get("pending") and not emb.get("running"):
                        break
                    await trio.sleep(1.0)
            out["embedded_s"] = round(time.perf_counter() - t, 1)
            out["embeddings"] = emb
        if mode == "fresh":  # asked now, while the back-fill runs: how many vectors were missing at the start
            out["pending_at_questions"] = ((await control.call(f"{SERVICE}/Status", {}))["embeddings"] or {}).get("pending")
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
                    "harness": h, "run_id": f"eval-{h}-{run_tag}", "workdir": str(checkout)}))["token"]
        scores: dict[str, Scores] = {}

        def score(q: dict[str, Any], found: list[tuple[str, str]]) -> None:
            g = group(q)
            for key in (g, f"{g} · {half(q)}") if q.get("set") not in ("black", "tune") else (g,):
                scores.setdefault(key, Scores()).add(q, found, subjects)
            if q.get("set") in ("heldout2", "heldout3", "noanswer", "noanswer_heldout", "noanswer_heldout2",
                                "noanswer_heldout3", "noanswer_heldout4"):  # its own row only: "all" stays comparable
                return
            if q["kind"] not in ("path", "path-recency", "changelog"):  # the NL questions together, per corpus
                key = "black natural (same+other)" if q.get("set") == "black" else "natural (same+other)"
                scores.setdefault(key, Scores()).add(q, found, subjects)
            if q["kind"] not in ("path", "path-recency", "changelog"):  # every NL question ("all questions")
                scores.setdefault("all", Scores()).add(q, found, subjects)
        times: list[float] = []
        scored: list[dict[str, Any]] = []  # --direct: every question's items and scores (the floor's calibration)
        if direct:
            from memactors.builtin import BuiltinProvider
            from memactors.repo import scope_for
            from memactors.store.engines import open_store

            store = await open_store(state / "memactors.db")
            stack.callback(store.close)
            provider = BuiltinProvider(store)
            if mode in ("embedded", "fresh"):
                from memactors.embedding import BUILTIN_MODEL, LocalEmbedder

                provider = BuiltinProvider(store, embedder=LocalEmbedder().embed, embedding_model=BUILTIN_MODEL,
                                           query_embedder=LocalEmbedder(query=True).embed, query_embed_deadline=30)
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
                score(q, [(by_id.get(i["id"], "?"), i["text"]) for i in items])
                scored.append({"query": q["query"], "kind": q["kind"], "set": q.get("set"), "answers": q["answers"],
                               "items": [[by_id.get(i["id"], "?"), i["score"]] for i in items]})
        else:
            clients = {}
            for r in repos:
                clients[r.key] = await stack.enter_async_context(gateway_client(d["gateway"], tokens[r.harnesses[0]]))
                await clients[r.key].call_tool("recall", {"query": "warm up", "limit": LIMIT})
            asked = questions
            waiting: dict[str, list[float]] = {}
            total = sum(out["episodes"].values())
            if mode == "fresh":  # the sets interleaved, so each meets the back-fill at every stage
                asked = sorted(questions, key=lambda q: hashlib.sha256(q["query"].encode()).digest())
            for q in asked:
                args = {"query": q["query"], "limit": LIMIT}
                if q.get("paths"):
                    args["paths"] = q["paths"]
                if mode == "fresh":  # how many episodes still had no vector when it was asked
                    pending = ((await control.call(f"{SERVICE}/Status", {}))["embeddings"] or {}).get("pending") or 0
                    waiting.setdefault(group(q), []).append(pending / max(total, 1))
                t = time.perf_counter()
                result = await clients[q["repo"]].call_tool("recall", args)
                times.append(time.perf_counter() - t)
                document = "".join(getattr(c, "text", "") for c in result.content)
                score(q, episode_runs(document))
        order = [*dict.fromkeys(GROUPS.values()), "natural (same+other)", "black natural (same+other)", "all",
                 *CHANGELOG_GROUPS, *(f"black {g}" for g in CHANGELOG_GROUPS)]
        out["recall"] = {k: scores[k].row() for k in sorted(
            scores, key=lambda k: (order.index(k.split(" · ")[0]), k))}
        out["recall_ms_p50"] = round(statistics.median(times) * 1000, 1)
        out["misses"] = {k: s.misses for k, s in scores.items()}
        if mode == "fresh" and not direct:
            out["pending_share_when_asked"] = {k: round(statistics.mean(v), 3) for k, v in waiting.items()}
        if mode == "fresh":
            out["pending_after_questions"] = ((await control.call(f"{SERVICE}/Status", {}))["embeddings"] or {}).get("pending")
        if scored:
            out["scored"] = scored

        # -- briefings --------------------------------------------------------------------------------
        briefings = []
        for r in (repos if briefings_wanted else ()):
            upcoming = {f for c in r.commits[-HOLDOUT:][:UPCOMING] for f in c.files}
            by_run = {c.run_id: c for c in kept[r.key]}
            for h in r.harnesses:
                mine = [c for c in kept[r.key] if r.harness(c) == h]
                newest = sorted(mine, key=lambda c: (c.started, c.run_id), reverse=True)[:3]
                own_next = {f for c in r.commits[-HOLDOUT:] if r.harness(c) == h for f in c.files}
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
                    # the files of this harness's own next runs (its commits among the HOLDOUT)
                    "has_next": bool(own_next),
                    "picks_touch_own": sum(touches(by_run[p], own_next) for p in picks if p in by_run),
                    "newest_touch_own": sum(touches(c, own_next) for c in newest),
                    "first_line": sum(" ".join(by_run[run].subject.split()) in " ".join(text.split())
                                      for run, text in shown if run in by_run),
                })
        out["briefings"] = briefings
    return out


def report(outs: dict[str, dict[str, Any]]) -> None:
    """Every mode's figures side by side (MRR and hit@3 per group), then each mode's details."""
    first = next(iter(outs.values()))
    print(f"machine: {first['machine']} · store: {first.get('store', 'sqlite')}")
    modes = list(outs)
    for mode, out in outs.items():
        line = f"[{mode}] episodes: {out['episodes']}  ingest: {out['ingest']} in {out['ingest_s']} s"
        line += f" (all recorded at {out.get('recorded_s')} s)"
        if "pending_at_questions" in out:
            line += (f"; asked with {out['pending_at_questions']} episodes without a vector"
                     f" ({out.get('pending_after_questions')} after the questions)")
        if "embedded_s" in out:
            emb = out.get("embeddings") or {}
            total = sum(out["episodes"].values())
            if not emb.get("embedded") and not emb.get("from_cache"):
                line += "; every episode had its vector already (a kept state directory)"
            else:
                line += (f"; every episode embedded at {out['embedded_s']} s from the ingest's start"
                         f" ({total / max(out['embedded_s'], 1e-9):.1f} episodes/s; {emb.get('embedded')} by the"
                         f" model, {emb.get('from_cache')} from the cache)")
        print(line)
    keys = list(dict.fromkeys(k for out in outs.values() for k in out["recall"]))
    head = "".join(f" {m + ' MRR':>14} {'hit@3':>6}" for m in modes)
    for mode, out in outs.items():
        if out.get("pending_share_when_asked"):
            print(f"[{mode}] mean share of episodes without a vector when asked: " + ", ".join(
                f"{k} {v:.0%}" for k, v in out["pending_share_when_asked"].items()))
    print(f"{'questions':34} {'n':>4}{head}")
    for k in keys:
        rows = [out["recall"].get(k) for out in outs.values()]
        n = next(r["n"] for r in rows if r)
        cells = "".join(f" {r['mrr']:>14.3f} {r['hit@3']:>6.2f}" if r else f" {'-':>14} {'-':>6}" for r in rows)
        print(f"{k:34} {n:>4}{cells}")
    print("gateway recall p50: " + ", ".join(f"{m} {out['recall_ms_p50']} ms" for m, out in outs.items()))
    for mode, out in outs.items():
        b = out.get("briefings", [])
        if not b:
            continue
        print(f"[{mode}] {'briefing':27} {'runs':>5} {'chars':>6} {'shown gw/cli':>12} {'picks touch':>11} {'newest touch':>12}")
        for row in b:
            print(f"{row['harness']:34} {row['runs']:>5} {row['chars']:>6} {row['shown_gateway']:>6}/{row['shown_cli']:<5}"
                  f" {row['picks_touch']:>8}/{len(row['picks'])} {row['newest_touch']:>10}/3")
        print(f"picks touching the upcoming work: {sum(r['picks_touch'] for r in b)}/{sum(len(r['picks']) for r in b)}"
              f"; the three newest runs: {sum(r['newest_touch'] for r in b)}/{3 * len(b)};"
              f" briefings showing >= 2 episodes: {sum(r['shown_gateway'] >= 2 for r in b)}/{len(b)} through the gateway,"
              f" {sum(r['shown_cli'] >= 2 for r in b)}/{len(b)} through `memory briefing`")
        for key in dict.fromkeys(row["repo"] for row in b):
            rows = [row for row in b if row["repo"] == key]
            pairs = [(x, y) for i, x in enumerate(rows) for y in rows[i + 1:]]
            nxt = [row for row in rows if row["has_next"]]
            print(f"{key}: harness pairs with different picks {sum(x['picks'] != y['picks'] for x, y in pairs)}"
                  f"/{len(pairs)}; picks touching the harness's own next runs"
                  f" {sum(row['picks_touch_own'] for row in nxt)}/{sum(len(row['picks']) for row in nxt)},"
                  f" its three newest {sum(row['newest_touch_own'] for row in nxt)}/{3 * len(nxt)}"
                  f" ({len(nxt)} harnesses with runs among the held-out commits)")


@contextlib.contextmanager
def postgres_server() -> Iterator[Any]:
    """A PostgreSQL server with pgvector for the run (the tests' server tree, `make postgres`), durable as
    the store benchmarks run it; removed afterwards."""
    from memactors.testing.postgres import Cluster

    with Cluster(durable=True, pgvector=True) as cluster:
        yield cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="clones of the repositories, in the data file's order")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--direct", action="store_true", help="questions in-process (ranking experiments)")
    parser.add_argument("--keep", help="keep the state directory here (and reuse it, without ingesting, when it exists)")
    parser.add_argument("--write-path-questions", action="store_true")
    parser.add_argument("--write-changelog-questions", action="store_true")
    parser.add_argument("--no-changelog", action="store_true", help="skip the changelog questions")
    parser.add_argument("--set", action="append", default=[], metavar="[MODULE.]NAME=VALUE",
                        help="with --direct: set a constant of memactors.builtin.ranking (or of memactors.MODULE) to a Python"
                             " literal, to try a change")
    parser.add_argument("--show-misses", action="store_true")
    parser.add_argument("--skip-set", action="append", default=[], metavar="SET",
                        help="leave out a question set (e.g. noanswer_heldout3 once its one run is done)")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                        help="the daemon's store: its SQLite file (default), or a PostgreSQL server with pgvector"
                             " started for the run (memactors.testing.postgres, the tests' tree; one fresh database"
                             " per mode)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="which configurations to compare, in this run (default: bm25,embedded)")
    args = parser.parse_args()
    data = load_questions(changelog=not args.no_changelog)
    if len(args.paths) > len(data["repos"]):
        parser.error(f"at most {len(data['repos'])} clones: {', '.join(data['repos'])}")
    repos = [Repo(key, spec["branch"], path) for (key, spec), path in zip(data["repos"].items(), args.paths, strict=False)]
    given = {r.key for r in repos}
    data["questions"] = [q for q in data["questions"] if q["repo"] in given and q.get("set") not in args.skip_set]
    for r in repos:
        r.commits = read_commits(r.path)
    if args.write_path_questions:
        write_path_questions(repos)
        return
    if args.write_changelog_questions:
        write_changelog_questions(repos)
        return
    if args.set:
        import ast
        import importlib

        for assignment in args.set:
            name, _, value = assignment.partition("=")
            module, _, name = name.rpartition(".")
            setattr(importlib.import_module(f"memactors.{module or 'builtin.ranking'}"), name, ast.literal_eval(value))
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="recall-quality-"))
    root.mkdir(parents=True, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m]
    outs: dict[str, dict[str, Any]] = {}
    if args.store == "postgres" and args.direct:
        parser.error("--direct reads the SQLite file: use it with --store sqlite")
    with postgres_server() if args.store == "postgres" else contextlib.nullcontext() as cluster:
        for mode in modes:
            url = None
            if cluster is not None:  # pgvector created by the administrator, as docs/fleet.md says
                url = cluster.create_database()
                cluster.admin("CREATE EXTENSION vector", dbname=url.rsplit("/", 1)[1])
            outs[mode] = trio.run(lambda mode=mode, url=url: evaluate(
                repos, data["questions"], root, direct=args.direct, mode=mode, briefings_wanted=mode == modes[-1],
                store_url=url))
    report(outs)
    if args.show_misses:
        for mode, out in outs.items():
            for kind, misses in out["misses"].items():
                for q in misses:
                    print(f"miss [{mode}] [{kind}] {q}")
    if args.json:
        Path(args.json).write_text(json.dumps(outs, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
