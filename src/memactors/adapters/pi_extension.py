"""The pi extension `memactors install pi` writes: the memory tools, and each session recorded.

pi (``@mariozechner/pi-coding-agent``) has no MCP client, by design; its extensions (TypeScript modules
listed in its ``settings.json`` ``extensions``) register tools and hear its lifecycle events. So the
extension does what an MCP client and two hooks do for the other agents:

* ``recall`` and ``briefing`` as pi tools, with the gateway's descriptions; each call runs ``memactors hook pi
  tool <name>`` with the arguments on stdin, which makes the call at the gateway as the resident (its token
  is read from the file install wrote in memactors' state directory, never from argv) and prints the
  tool's text, the fenced memory document;
* ``session_shutdown`` (pi exiting, a headless ``pi -p`` too, or switching sessions): the session file
  (``ctx.sessionManager.getSessionFile()``) and the directory piped, as JSON, to ``memactors hook pi
  session-end``, which reads the file into a run record and ingests it, or spools it.

The prompt is never handed to memactors; nothing is typed into the session. Inside a ``memactors run``
(``MEMACTORS_RUN_ID`` set) the session is the daemon's to record: the extension records nothing.
"""

from __future__ import annotations

import json
import shlex

__all__ = ["MARK", "extension_source"]

#: The first line of the extension: what says the file is memactors'.
MARK = "// memactors install: the memory tools for pi, and each session recorded."

_SOURCE = r"""__MARK__
// `memactors uninstall pi` removes this file. See docs/connect-an-agent.md ("pi as a resident").
import { spawnSync } from "node:child_process"

const TOOL = __TOOL__
const END = __END__
const SUPERVISED = Boolean(process.env.MEMACTORS_RUN_ID)

function memactors(argv, input, timeout) {
  const done = spawnSync(argv[0], argv.slice(1), { input: JSON.stringify(input), encoding: "utf8", timeout,
                                                   maxBuffer: 8 << 20 })
  return { ok: done.status === 0, out: done.stdout || "", err: (done.stderr || "").trim() }
}

function tool(name, label, description, parameters) {
  return {
    name, label, description, parameters,
    async execute(_id, params) {
      const done = memactors([...TOOL, name], params || {}, 30000)
      if (!done.ok) throw new Error(done.err || `memactors ${name} failed`)
      return { content: [{ type: "text", text: done.out }], details: {} }
    },
  }
}

export default function (pi) {
  pi.registerTool(tool("recall", "Recall memory",
    "Recall facts, past episodes and runs that edited given paths in your repository.",
    { type: "object", properties: {
        query: { type: "string", minLength: 1, description: "what to recall" },
        paths: { type: "array", items: { type: "string" }, description: "paths you will touch" },
        limit: { type: "integer", minimum: 1, maximum: 50 } },
      required: ["query"], additionalProperties: false }))
  pi.registerTool(tool("briefing", "Read your briefing",
    "Your briefing: collisions, recent runs, facts and episodes. Read it once before you start work.",
    { type: "object", properties: { refresh: { type: "boolean" } }, additionalProperties: false }))
  pi.on("session_shutdown", async (_event, ctx) => {
    const file = ctx.sessionManager?.getSessionFile?.()
    if (SUPERVISED || !file || !END.length) return
    const done = memactors(END, { session_file: file, cwd: ctx.cwd || process.cwd() }, 30000)
    if (!done.ok && done.err) process.stderr.write(done.err + "\n")
  })
}
"""


def _argv(command: str) -> str:
    return json.dumps(shlex.split(command)) if command else "[]"


def extension_source(tool_command: str, end_command: str) -> str:
    """The extension's text: ``tool_command`` (``… hook pi tool``, the tool's name appended) and
    ``end_command`` (``… hook pi session-end``) as argv arrays, never shell lines."""
    return (_SOURCE.replace("__MARK__", MARK).replace("__TOOL__", _argv(tool_command))
            .replace("__END__", _argv(end_command)))
