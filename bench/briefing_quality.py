"""Each harness's default briefing on an imported real history, through the gateway.

`memactors import git` is how a new install gets its memory, so the briefing it yields is the first one
users read. This bench imports a real public history into a fresh daemon (the default configuration:
built-in provider, embedded model) with the CLI as a subprocess, then reads each harness's default
briefing (`briefing_max_chars = 2000`) through the gateway's `briefing` tool with a run token whose
workdir is a checkout of the project on its default branch, and prints per harness:

* episodes shown, and recent_runs lines shown and how many of them carry a gist (text, not provenance alone);
* the age of every item shown (episodes and recent runs) as its place among the newest runs of the
  harness (its own imported ones; a harness without runs yet: the repository's) — "≤ 50" is the target;
* bytes used of the cap, and what each section dropped to fit ("N more not shown").

    git clone --mirror https://github.com/encode/httpx /tmp/httpx.git
    .venv/bin/python bench/briefing_quality.py /tmp/httpx.git --repo-key github.com/encode/httpx [--json out.json]

The harnesses: `imported` (the import's own, holding every commit) and two residents that have not run
yet (`claude`, a claude-code harness; `codex`, a codex one) — what a user meets right after
`memactors install` and `import git`. `--embeddings off` runs BM25-only (the briefing's query does not
use the model; the default is on, as shipped).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recall_quality import cli, machine  # noqa: E402
from user_paths import SERVICE, daemon, gateway_client  # noqa: E402

from memactors.rpc.client import connect_rpc  # noqa: E402

#: (harness table name, its agent) configured besides the import's own `imported`.
RESIDENTS = (("claude", "claude-code"), ("codex", "codex"), ("docs", "codex"), ("test-fixer", "claude-code"))
#: An item older than the harness's newest NEWEST runs counts as old (the target's measure).
NEWEST = 50
_SECTION = re.compile(r"^## (\w+)", re.M)
_DROPPED = re.compile(r"^\((\d+) more not shown", re.M)
_ITEM = re.compile(r'^- (episode|run) ([^\n]*)\n(?:<item[^>\n]*>\n(.*?)\n</item nonce="[0-9a-f]+">)?', re.M | re.S)
_RUN_ID = re.compile(r"\brun (git-[0-9a-f]+)")


def commits(repo: str) -> list[tuple[str, str, str]]:
    """(run id, author time, subject) of the non-merge commits of HEAD, newest first (git's order, as
    `import git` reads them)."""
    out = subprocess.run(["git", "-C", repo, "log", "--no-merges", "--format=%H%x1f%aI%x1f%s", "HEAD"],
                         capture_output=True, text=True, check=True).stdout
    return [(f"git-{sha}", at, subject) for sha, at, subject in (line.split("\x1f", 2) for line in out.splitlines())]


def sections(document: str) -> dict[str, dict[str, Any]]:
    """Per section of a briefing's text: its items (label, provenance, text) and how many it dropped."""
    out: dict[str, dict[str, Any]] = {}
    heads = list(_SECTION.finditer(document))
    for i, head in enumerate(heads):
        body = document[head.end(): heads[i + 1].start() if i + 1 < len(heads) else len(document)]
        dropped = _DROPPED.search(body)
        out[head.group(1)] = {
            "items": [(m.group(1), m.group(2), m.group(3) or "") for m in _ITEM.finditer(body)],
            "dropped": int(dropped.group(1)) if dropped else 0,
        }
    return out


def places(items: list[tuple[str, str, str]], order: dict[str, int]) -> list[int | None]:
    """Each item's place (1 = newest) among the runs `order` ranks, None when its run id is not there."""
    found = []
    for label, provenance, _ in items:
        m = _RUN_ID.search(provenance if label == "episode" else f"run {provenance}")
        found.append(order.get(m.group(1)) if m else None)
    return found


async def evaluate(repo: str, key: str, root: Path, embeddings: bool) -> dict[str, Any]:
    state = root / "state"
    tables = "".join(f'[harness.{h}]\nharness = "{agent}"\n' for h, agent in (("imported", "claude-code"), *RESIDENTS))
    config = root / "harness.toml"
    config.write_text(f'[store]\npath = "{state}"\n[operator]\nlisten = "127.0.0.1:0"\n'
                      '[gateway]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:0"\n'
                      + ("" if embeddings else "[memory]\nembeddings = false\n") + tables, encoding="utf-8")
    history = commits(repo)
    newest = {run: i + 1 for i, (run, _, _) in enumerate(history)}  # every run is the `imported` harness's
    subject = {run: s for run, _, s in history}
    out: dict[str, Any] = {"machine": machine(), "commits": len(history), "briefings": []}
    async with daemon(root, config, state) as d:
        t = time.perf_counter()
        done = await trio.to_thread.run_sync(lambda: cli(config, root, "import", "git", "--repo", repo,
                                                         "--repo-key", key, "--json"))
        out["import_s"] = round(time.perf_counter() - t, 1)
        if done.returncode != 0:
            raise SystemExit(f"import git failed: {done.stderr[-500:]}")
        async with connect_rpc(d["operator"], d["control"]) as control:
            with trio.fail_after(900):
                while (await control.call(f"{SERVICE}/Status", {}))["pending"].get("records"):  # noqa: ASYNC110
                    await trio.sleep(0.5)
            branch = (await trio.run_process(["git", "-C", repo, "symbolic-ref", "--short", "HEAD"],
                                             capture_stdout=True)).stdout.decode().strip()
            checkout = root / "checkout"
            checkout.mkdir()
            for argv in (["init", "-q", "-b", branch], ["remote", "add", "origin", f"https://{key}.git"],
                         ["-c", "user.name=eval", "-c", "user.email=eval@example.invalid", "commit", "-q",
                          "--allow-empty", "-m", "eval"]):
                await trio.run_process(["git", "-C", str(checkout), *argv], capture_stdout=True)
            for h in ("imported", *(name for name, _ in RESIDENTS)):
                token = (await control.call(f"{SERVICE}/MintRunToken", {
                    "harness": h, "run_id": f"eval-{h}-{int(time.time()):x}", "workdir": str(checkout)}))["token"]
                async with gateway_client(d["gateway"], token) as client:
                    doc = "".join(getattr(c, "text", "") for c in (await client.call_tool("briefing", {})).content)
                secs = sections(doc)
                eps = secs.get("episodes", {"items": [], "dropped": 0})
                runs = secs.get("recent_runs", {"items": [], "dropped": 0})
                ep_places, run_places = places(eps["items"], newest), places(runs["items"], newest)
                every = [p for p in (*ep_places, *run_places) if p is not None]
                out["briefings"].append({
                    "harness": h, "bytes": len(doc.encode("utf-8")),
                    "episodes": len(eps["items"]), "recent_runs": len(runs["items"]),
                    "runs_with_gist": sum(bool(text) for _, _, text in runs["items"]),
                    "episode_places": ep_places, "run_places": run_places,
                    "older_than_newest_50": sum(p > NEWEST for p in every),
                    "dropped": {name: s["dropped"] for name, s in secs.items() if s["dropped"]},
                    "episode_subjects": [subject.get(m.group(1), "?") if (m := _RUN_ID.search(p)) else "?"
                                         for _, p, _ in eps["items"]],
                    "document": doc,
                })
    return out


def report(out: dict[str, Any]) -> None:
    print(f"# briefing_quality: {out['commits']} commits imported in {out['import_s']} s; {out['machine']}")
    print(f"{'harness':10} {'bytes':>6} {'episodes':>8} {'runs (gist)':>11} {'places (1 = newest)':>32} "
          f"{'> 50':>5}  dropped")
    for b in out["briefings"]:
        where = f"{b['episode_places']} / {b['run_places']}"
        dropped = ", ".join(f"{k} {v}" for k, v in b["dropped"].items()) or "-"
        print(f"{b['harness']:10} {b['bytes']:>6} {b['episodes']:>8} {b['recent_runs']:>5} ({b['runs_with_gist']}) "
              f"{where:>32} {b['older_than_newest_50']:>5}  {dropped}")
        for s in b["episode_subjects"]:
            print(f"{'':10} episode: {s[:90]}")
    shown = sum(b["episodes"] >= 2 for b in out["briefings"])
    print(f"briefings showing >= 2 episodes: {shown}/{len(out['briefings'])}; items older than the newest "
          f"{NEWEST} runs: {sum(b['older_than_newest_50'] for b in out['briefings'])}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("repo", help="a clone or bare mirror of a public repository")
    p.add_argument("--repo-key", required=True, help="its repository key, e.g. github.com/encode/httpx")
    p.add_argument("--embeddings", choices=("on", "off"), default="on")
    p.add_argument("--json", help="write the figures (and each briefing's text) here")
    p.add_argument("--show", action="store_true", help="print each briefing's text")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="briefing-quality-") as tmp:
        out = trio.run(evaluate, args.repo, args.repo_key, Path(tmp), args.embeddings == "on")
    report(out)
    if args.show:
        for b in out["briefings"]:
            print(f"\n--- {b['harness']} ---\n{b['document']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
