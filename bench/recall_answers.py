"""Every answer a recall gives on recall_profile's corpus, written to one JSON file, so two trees'
answers can be compared byte for byte (a change meant to make recall cheaper must not change them).

    .venv/bin/python bench/recall_answers.py --keep DIR --out this.json
    PYTHONPATH=MAIN/src .venv/bin/python bench/recall_answers.py --keep DIR --out main.json
    cmp main.json this.json

For each of the corpus's first `--queries` questions, with the embedded model on and with `[memory]
embeddings = false` (`relevance_floor = 0`, so every answer serves its items): the built-in provider's
items (ids, texts, scores) for the question, the same with a path asked, the agent's document (a run
token's `recall`) and the operator's; then five metadata-only (briefing) queries. A document's nonce
is random, so it is written as `N`. It prints which `memactors` it ran and the machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import trio
from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recall_profile import LIMIT, embedded_corpus, settings  # noqa: E402
from user_paths import REPOS, machine, repo, write_config  # noqa: E402

import memactors  # noqa: E402
from memactors.config import ConfigHolder, load_config  # noqa: E402
from memactors.repo import scope_for  # noqa: E402
from memactors.service import open_memory_service  # noqa: E402

_NONCE = re.compile(r'nonce="[0-9a-f]+"')


async def answers(root: Path, state: Path, queries: list[tuple[int, str]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for embeddings in (True, False):
        config = write_config(root, state, settings(0.0, embeddings))
        holder = ConfigHolder(lambda config=config: load_config(config, env={"HOME": str(root)}))
        async with open_memory_service(holder) as svc:
            tokens = {z: (await svc.mint_run_token(harness=f"h{z:02d}", run_id=f"live{z}"))["token"]
                      for z in range(REPOS)}
            for z, q in queries:
                scope = scope_for(repo(z))
                view = await svc.caller_view(tokens[z])
                agent = await svc.agent_recall(view, query=q, limit=LIMIT, call_id="bench")
                operator = await svc.recall(query=q, repo=repo(z), limit=LIMIT)
                out.append({
                    "embeddings": embeddings, "query": q,
                    "provider": await svc.builtin.recall({"query": q, "scope": [scope], "limit": 2 * LIMIT}),
                    "paths": await svc.builtin.recall({"query": q, "scope": [scope], "limit": 2 * LIMIT,
                                                       "paths": ["src/a.py"]}),
                    "agent": _NONCE.sub('nonce="N"', agent.text),
                    "operator": _NONCE.sub('nonce="N"', operator["document"])})
            for z in range(5):  # REQ-14's briefing query: metadata only
                out.append({"embeddings": embeddings, "briefing_query": z, "provider": await svc.builtin.recall(
                    {"query": f"{repo(z)} main h{z:02d}", "scope": [scope_for(repo(z))], "limit": 2 * LIMIT})})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=120)
    parser.add_argument("--keep", type=Path, help="directory to build (and reuse) the corpus in")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(machine(), flush=True)
    logger.remove()
    with embedded_corpus(args.keep, args.size) as (root, state, queries):
        out = trio.run(answers, root, state, queries[:args.queries])
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True, ensure_ascii=False), encoding="utf-8")
    print(f"{len(out)} answers from {memactors.__file__} in {args.out}")


if __name__ == "__main__":
    main()
