"""A stand-in for the ``claude`` binary, for the claude-code adapter: ``fake_claude.py MODE OUT [claude args...]``.

Run through a small wrapper script (``support_runs.fake_claude``) that is the harness's ``command``, so
the runs actor starts it exactly as it starts the real CLI. It first writes the argv it received (the
wrapper's path, then every argument the adapter built) to OUT/argv-<n>.json, then prints Claude Code's
stream-json:

- ``once``: ``system/init``, one assistant text, a ``result`` of subtype ``success``; exits 0.
- ``loop``: an agent that never stops and ignores ``--max-turns`` / ``--max-budget-usd`` (as an older
  CLI would): a Bash call and its result each turn, and every turn a ``result`` event with the session's
  running ``total_cost_usd`` ($0.01 a turn), as a stream-json session reports after each turn. Writes
  its pid to OUT/pid first.
"""

import json
import os
import sys
import time
from pathlib import Path

mode, out, args = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
out.mkdir(parents=True, exist_ok=True)
n = len(list(out.glob("argv-*.json")))
(out / f"argv-{n}.json").write_text(json.dumps([os.environ.get("FAKE_CLAUDE_ARGV0", "claude"), *args]),
                                    encoding="utf-8")
SESSION = "0b5c4d3e-fake-4c1a-9e2f-5d6c7b8a9f00"


def emit(event: dict) -> None:
    print(json.dumps(event), flush=True)


emit({"type": "system", "subtype": "init", "session_id": SESSION, "model": "claude-fake-1", "cwd": os.getcwd()})
if mode == "once":
    emit({"type": "assistant", "message": {"id": "msg_1", "model": "claude-fake-1",
                                           "content": [{"type": "text", "text": "triaged"}]}})
    emit({"type": "result", "subtype": "success", "is_error": False, "result": "triaged", "num_turns": 1,
          "total_cost_usd": 0.001, "session_id": SESSION})
elif mode == "loop":
    (out / "pid.tmp").write_text(str(os.getpid()), encoding="utf-8")
    os.replace(out / "pid.tmp", out / "pid")
    turn = 0
    while True:
        turn += 1
        tool_id = f"toolu_{turn:04d}"
        emit({"type": "assistant", "message": {"id": f"msg_{turn:04d}", "model": "claude-fake-1", "content": [
            {"type": "tool_use", "id": tool_id, "name": "Bash", "input": {"command": f"echo turn {turn}"}}]}})
        emit({"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id, "content": f"turn {turn}", "is_error": False}]}})
        emit({"type": "result", "subtype": "success", "is_error": False, "result": f"turn {turn}",
              "num_turns": turn, "total_cost_usd": round(0.01 * turn, 4), "session_id": SESSION})
        time.sleep(0.05)
