"""A tiny stand-in agent for the ``command`` adapter tests: ``agent_script.py MODE OUT PROMPT``.

MODE: ``write`` writes notes.txt in the cwd and says so; ``env`` writes OUT/env.json (what reached it:
variable names, the MEMACTORS_* values but the token, the MCP config file's mode and shape); ``briefing``
calls the gateway's briefing tool with the daemon's MCP config file and writes OUT/briefing.txt;
``fail`` exits 3; ``sleep`` writes its pid to
OUT/pid and sleeps; ``stubborn`` does the same but ignores SIGTERM; ``refuse`` refuses to start as a CLI
does on a bad flag: no stdout, an error (with a token in it) on stderr after 100 KB of noise, its usage
line echoing the prompt, exit 2; ``echo`` prints its prompt on stdout. Every mode first saves the prompt it was given to OUT/prompt-<n>.txt
(outside the daemon's state directory) so a test can read it.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

mode, out, prompt = sys.argv[1], Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else ""
out.mkdir(parents=True, exist_ok=True)
n = len(list(out.glob("prompt-*.txt")))
(out / f"prompt-{n}.txt").write_text(prompt, encoding="utf-8")
if mode == "refuse":
    for i in range(1000):
        sys.stderr.write(f"noise line {i:04d} " + "." * 90 + "\n")
    sys.stderr.write(f"usage: agent [options] {prompt}\n")
    sys.stderr.write("error: unknown option '--no-such-flag' (token ghp_" + "A1b2C3d4E5" * 3 + "f6G7h8)\n")
    sys.exit(2)
print(f"agent {mode} starting", flush=True)
if mode == "echo":
    print(f"my prompt was:\n{prompt}\ndone", flush=True)
elif mode == "write":
    Path("notes.txt").write_text("remember the ledger\n", encoding="utf-8")
    print("wrote notes.txt; all good", flush=True)
elif mode == "env":
    # What reached the agent: variable names, the memactors values, and the MCP config file's facts.
    config_path = os.environ.get("MEMACTORS_MCP_CONFIG")
    facts = {"names": sorted(os.environ), "memactors": {k: v for k, v in os.environ.items()
                                                       if k.startswith("MEMACTORS_") and k != "MEMACTORS_RUN_TOKEN"}}
    if config_path:
        body = json.loads(Path(config_path).read_text(encoding="utf-8"))
        server = body["mcpServers"]["memactors"]
        facts["mcp"] = {"mode": oct(os.stat(config_path).st_mode & 0o777), "type": server["type"],
                        "url": server["url"], "bearer_is_token": server["headers"]["Authorization"]
                        == f"Bearer {os.environ.get('MEMACTORS_RUN_TOKEN')}"}
    (out / "env.json").write_text(json.dumps(facts), encoding="utf-8")
elif mode == "briefing":
    # Call the gateway's briefing tool as this run, with the MCP config file the daemon wrote.
    import httpx2
    import mcp
    import trio
    from mcp.client.streamable_http import streamable_http_client

    server = json.loads(Path(os.environ["MEMACTORS_MCP_CONFIG"]).read_text(encoding="utf-8"))["mcpServers"]["memactors"]

    async def fetch() -> str:
        async with httpx2.AsyncClient(headers=server["headers"], timeout=None) as http, \
                mcp.Client(streamable_http_client(server["url"], http_client=http)) as client:
            result = await client.call_tool("briefing", {})
            return "".join(getattr(c, "text", "") for c in result.content)

    (out / "briefing.txt").write_text(trio.run(fetch), encoding="utf-8")
    print("read my briefing", flush=True)
elif mode == "fail":
    print("cannot do it", flush=True)
    sys.exit(3)
elif mode in ("sleep", "stubborn"):
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    (out / "pid.tmp").write_text(str(os.getpid()), encoding="utf-8")
    os.replace(out / "pid.tmp", out / "pid")
    time.sleep(600)
