"""The memory service: the supervised actors wired together, and MemoryService's handlers (REQ-19).

`open_memory_service(holder)` is how the daemon embeds memactors:

    async with open_memory_service(ConfigHolder(load_config)) as memory:
        await memory.ingest_run(record_json)

Inside, a one-for-one supervisor runs the actors (provider session, index, summary, assembler,
retention); they talk only through their addresses. MemoryService's handlers are the single path every
surface (RPC, CLI, gateway, TUI) takes: none has a private one.

The package, by who calls what:

- ``wiring``: MemoryService and `open_memory_service` (the store, the supervisor, the actors);
- ``parts``: what every handler works with (MemoryService's base);
- ``agent_calls``: the agents' handlers (the gateway's MCP tools, a run's spawn);
- ``read_tier`` and ``control_tier``: the operator RPC's read and control methods;
- ``daemon_runs``: closed run records in, and the runs the daemon starts;
- ``ingest``, the ingest pipeline, a stage below the handlers that reaches the actors through the
  `Stages` it is handed; ``providers``, how the daemon reaches its provider and checks one (REQ-4);
  ``installs``, whether each resident install works; ``import_rows``, what `store import` lets in.

May import: the actors, the built-in provider, the agent side, the store and the pure modules; never a
surface (the RPC method table, the gateway and the daemon import this package, not the reverse).
"""

from .wiring import DB_NAME as DB_NAME
from .wiring import MemoryService as MemoryService
from .wiring import open_memory_service as open_memory_service
