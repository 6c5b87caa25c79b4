"""The OpenCode plugin `memactors install opencode` writes: the briefing at session start, each
session recorded.

OpenCode 1.18 loads every ``{plugin,plugins}/*.{js,ts}`` of its config directories (``~/.config/opencode``,
a project's ``.opencode``) as a module whose exported functions return hooks. It has no session-start or
session-end hook a command could run, so the plugin does both itself:

* ``experimental.chat.system.transform`` (called before each model request, with the ``sessionID``):
  on a session's first request it runs ``memactors hook opencode session-start`` (asynchronously, 10 s
  at most; the hook's own exchange gives up after 3 s and then prints nothing) with the hook input Claude
  Code's and Gemini CLI's session-start hooks get, ``{"source": "startup"}`` (``"resume"`` for a session
  OpenCode did not create in this process: ``opencode run --session``/``--continue``, whose briefing was
  composed before), and adds the ``hookSpecificOutput.additionalContext`` it printed, the fenced briefing,
  to the system prompt of every request of that session (a subagent's session gets its root session's).
* The bus events (``event`` hook): ``session.created`` / ``session.updated`` (its directory, times,
  parent), ``message.updated`` (which messages are the assistant's, the model), ``message.part.updated``
  (each part as last updated, cut to what the record needs: a tool's name, status, path or command and
  exit status, never its output; a step's tokens and cost; the assistant's text) and ``session.error``.
  The user's messages' parts (the prompt) are never kept.
* When OpenCode exits (``process.on("exit")``: synchronous, so the record is handed over before the
  process ends) each root session that did something is piped, as JSON, to ``memactors hook opencode
  session-end``, which builds its run record and ingests it, or spools it when the daemon is down.
  OpenCode's own stdout (``run --format json``) stays clean: the hooks' stdout is not shown, their stderr is.

No token in the plugin: the hooks read it from the ``opencode.json`` install wrote.
"""

from __future__ import annotations

import json
import shlex

__all__ = ["MARK", "plugin_source"]

#: The first line of the plugin: what says the file is memactors'.
MARK = "// memactors install: records this resident's OpenCode sessions and gives each its briefing."

_SOURCE = r"""__MARK__
// `memactors uninstall opencode` removes this file. See docs/connect-an-agent.md ("OpenCode as a resident").
import { execFile, spawnSync } from "node:child_process"

// In a session `memactors run` started, the daemon briefs and records it: the hooks would do nothing.
const SUPERVISED = Boolean(process.env.MEMACTORS_RUN_ID)
const START = SUPERVISED ? [] : __START__
const END = SUPERVISED ? [] : __END__
const sessions = new Map() // id -> { parent, directory, created, updated, model, here, errors }
const roles = new Map() // message id -> "user" | "assistant"
const parts = new Map() // part id -> [first seen, session id, part cut to what the record needs]
const briefings = new Map() // root session id -> Promise<string>
let seen = 0

function info(id) {
  if (!sessions.has(id)) sessions.set(id, { errors: [] })
  return sessions.get(id)
}

function root(id) {
  for (let n = 0; n < 32 && sessions.get(id)?.parent; n++) id = sessions.get(id).parent
  return id
}

function cut(part) {
  const out = { id: part.id, type: part.type, messageID: part.messageID }
  if (part.type === "text") {
    out.text = part.synthetic ? "" : part.text
    out.time = part.time
  } else if (part.type === "tool") {
    const state = part.state || {}
    const given = state.input || {}
    const input = {}
    for (const key of ["filePath", "command"]) if (typeof given[key] === "string") input[key] = given[key]
    for (const key of ["patchText", "patch", "input"]) {
      if (typeof given[key] === "string") {
        input.patchText = given[key].split("\n").filter((line) => /^\*\*\* (Add|Update|Delete) File: /.test(line)).join("\n")
      }
    }
    out.tool = part.tool
    out.state = { status: state.status, input, metadata: { exit: state.metadata?.exit }, time: state.time }
  } else if (part.type === "step-finish") {
    out.reason = part.reason
    out.tokens = part.tokens
    out.cost = part.cost
  }
  return out
}

function context(stdout) {
  try {
    return String(JSON.parse(stdout).hookSpecificOutput.additionalContext || "")
  } catch {
    return "" // nothing printed: no briefing (the daemon down or slow, or an empty briefing)
  }
}

function briefing(id, resume) {
  if (!START.length) return Promise.resolve("")
  if (!briefings.has(id)) {
    briefings.set(id, new Promise((resolve) => {
      const child = execFile(START[0], START.slice(1), { timeout: 10000, maxBuffer: 1 << 20 },
        (error, stdout) => resolve(error ? "" : context(String(stdout))))
      child.stdin?.on("error", () => {})
      child.stdin?.end(JSON.stringify({ session_id: id, source: resume ? "resume" : "startup" }))
    }))
  }
  return briefings.get(id)
}

function record() {
  if (!END.length) return
  for (const [id, session] of sessions) {
    if (session.parent) continue
    const mine = [...parts.values()].filter(([, sid, part]) => root(sid) === id && roles.get(part.messageID) === "assistant")
    if (!mine.length) continue
    mine.sort((a, b) => a[0] - b[0])
    const doc = { session_id: id, directory: session.directory, started_at: session.created,
                  ended_at: session.updated || Date.now(), model: session.model, parts: mine.map(([, , part]) => part),
                  errors: session.errors }
    spawnSync(END[0], END.slice(1), { input: JSON.stringify(doc), stdio: ["pipe", "ignore", "inherit"], timeout: 30000 })
  }
}

export const MemactorsResident = async () => {
  process.on("exit", record)
  return {
    event: async ({ event }) => {
      const props = event.properties || {}
      if (event.type === "session.created" || event.type === "session.updated") {
        const given = props.info || {}
        const session = info(given.id || props.sessionID)
        if (event.type === "session.created") session.here = true
        session.parent = given.parentID || session.parent
        session.directory = given.directory || session.directory
        session.created = given.time?.created || session.created
        session.updated = given.time?.updated || session.updated
      } else if (event.type === "message.updated") {
        const message = props.info || {}
        roles.set(message.id, message.role)
        if (message.role === "assistant" && message.modelID) {
          info(message.sessionID).model = message.providerID ? `${message.providerID}/${message.modelID}` : message.modelID
        }
      } else if (event.type === "message.part.updated" && props.part && props.part.id) {
        const earlier = parts.get(props.part.id)
        parts.set(props.part.id, [earlier ? earlier[0] : seen++, props.part.sessionID, cut(props.part)])
      } else if (event.type === "session.error" && props.sessionID) {
        info(props.sessionID).errors.push({ name: props.error?.name || "error" })
      }
    },
    "experimental.chat.system.transform": async (input, output) => {
      if (!input.sessionID) return
      const id = root(input.sessionID)
      const text = await briefing(id, !sessions.get(id)?.here)
      if (text.trim()) output.system.push(text.trim())
    },
  }
}
"""


def _argv(command: str) -> str:
    """A hook command line as the JSON array the plugin runs (no shell in between)."""
    return json.dumps(shlex.split(command)) if command else "[]"


def plugin_source(start_command: str, end_command: str) -> str:
    """The plugin's text for these hook command lines (``cli/install`` builds them)."""
    return (_SOURCE.replace("__MARK__", MARK).replace("__START__", _argv(start_command))
            .replace("__END__", _argv(end_command)))
