"""The configuration's models: one frozen attrs class per table (``[memory]``, ``[harness.<name>]``,
``[mcp.<name>]``, ``[store]``, ...), with their defaults. What the files may say and how they are read is
``config.load``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import attrs

from .._toml_tables import EMPTY as _EMPTY
from ..urls import mask_url

Origin = Literal["global", "dropin", "project"]

#: ``[harness.<name>] verify_patterns`` default: a shell command an agent ran that matches one of these
#: regular expressions is a verify step (its exit status becomes the verify event's ok).
DEFAULT_VERIFY_PATTERNS = (
    r"\bpytest\b",
    r"\bgo\s+test\b",
    r"\bcargo\s+test\b",
    r"\bnpm\s+(?:run\s+)?test\b",
)


@attrs.frozen
class EpisodesConfig:
    """``[memory.episodes]`` (REQ-1): retention, summary, recall deadline and excerpt cap.

    Durations are float seconds; ``retention_text`` keeps what the operator wrote for status output.
    """

    retention: float = 90 * 86400.0
    summary: bool = True
    provider_timeout: float = 2.0
    excerpt_chars: int = 600
    retention_text: str = "90d"
    provider_timeout_text: str = "2s"


#: ``[memory] relevance_floor``'s default (the built-in provider's `ranking.RELEVANCE_FLOOR`).
RELEVANCE_FLOOR = 0.4


@attrs.frozen
class MemoryConfig:
    """``[memory]`` (REQ-1): the provider, ``"builtin"`` or the key of a global ``[mcp.<name>]``."""

    provider: str = "builtin"
    episodes: EpisodesConfig = attrs.Factory(EpisodesConfig)
    #: ``embeddings`` (REQ-11): the built-in provider's hybrid ranking. True (the default): with the
    #: embedded model, or with ``[model_api] embedding_model`` when that is set; False: BM25 alone.
    embeddings: bool = True
    #: ``relevance_floor``: the built-in provider serves no item scoring below it on its
    #: 0–1 relevance scale (docs/contracts.md); 0 serves every match.
    relevance_floor: float = 0.4  # RELEVANCE_FLOOR

    @property
    def is_builtin(self) -> bool:
        """True when episodes go to the in-process built-in provider (REQ-11)."""
        return self.provider == "builtin"


@attrs.frozen
class ModelApiConfig:
    """``[model_api]``: an OpenAI-compatible endpoint for summaries and embeddings."""

    base_url: str
    api_key_env: str | None = None
    utility_model: str | None = None
    embedding_model: str | None = None
    requests_per_minute: int = 60
    daily_requests: int = 2000


@attrs.frozen
class McpServerConfig:
    """``[mcp.<name>]``: one upstream, over stdio (``command``) or streamable HTTP (``url``).

    ``origin`` says where it was first declared: the global file, a drop-in, or only a project file
    (``origin_file`` is that file). Only global or drop-in upstreams may be the memory provider.
    """

    name: str
    origin: Origin
    origin_file: Path
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = _EMPTY
    url: str | None = None
    headers: Mapping[str, str] = _EMPTY
    shared: bool = True
    #: ``own_text``: the upstream writes its own item text (a summary, a rewrite) rather than drawing it
    #: from the episode memactors gave it, so REQ-9's text check is skipped for it (see README
    #: "What a lying provider can and cannot do"). Default false: item text must come from the episode.
    own_text: bool = False
    #: ``spare_process``: keep one spare process of a stdio upstream started in advance, so a provider
    #: that dies is replaced in well under a second instead of after a new interpreter's start-up. Set
    #: it false for a provider that must not run twice at once or loads shared state only at start.
    spare_process: bool = True

    @property
    def transport(self) -> Literal["stdio", "http"]:
        """How the daemon reaches it: a subprocess over stdio, or streamable HTTP."""
        return "stdio" if self.command is not None else "http"


@attrs.frozen
class McpDefaults:
    """``[mcp]`` keys: the policy a harness gets when it names none, and eager or lazy tool exposure."""

    default_policy: str = "default"
    exposure: Literal["eager", "lazy"] = "eager"


@attrs.frozen
class McpPolicy:
    """``[mcp_policy.<name>]``: the upstreams a harness under this policy may see."""

    name: str
    servers: tuple[str, ...] = ()


@attrs.frozen
class HarnessConfig:
    """``[harness.<name>]``: the keys memactors reads (REQ-8, REQ-14, REQ-16, REQ-20).

    ``memory_record_explicit`` records whether some file set ``memory_record``, because an explicit
    ``true`` beside ``record_trace = false`` is an error while the default is not. ``template_text`` is
    the template in force (``prompt_template`` or the contents of ``prompt_template_file``, read at load).
    """

    name: str
    harness: str
    origin: Origin
    workdir: str | None = None
    memory_record: bool = True
    memory_record_explicit: bool = False
    record_trace: bool = True
    memory_briefing: bool = False
    briefing_max_chars: int = 2000
    untrusted_inline: bool = False
    prompt: str | None = None
    prompt_file: str | None = None
    prompt_template: str | None = None
    prompt_template_file: str | None = None
    template_text: str | None = None
    args: tuple[str, ...] = ()
    #: What ``memactors run`` needs to run the harness headless (docs/runs.md).
    command: str | None = None
    allowed_tools: tuple[str, ...] = ()
    permission_mode: str | None = None
    model: str | None = None
    extra_args: tuple[str, ...] = ()
    timeout: float = 1800.0
    timeout_text: str = "30m"
    #: Per-harness caps on a supervised run (docs/runs.md "Caps"): model turns, and the agent's reported
    #: cost in US dollars. None: no cap but ``timeout``.
    max_turns: int | None = None
    max_cost_usd: float | None = None
    verify_patterns: tuple[str, ...] = DEFAULT_VERIFY_PATTERNS
    #: REQ-18: this harness consents to exporting its memory spans (ids, provider, outcome, sizes only).
    export_telemetry: bool = False

    @property
    def records_episodes(self) -> bool:
        """REQ-8's harness half: a trace is kept and memory recording is not turned off."""
        return self.record_trace and self.memory_record

    @property
    def is_prompt_one_shot(self) -> bool:
        """True when one of the four prompt keys is set (REQ-16 prepends briefings only to these)."""
        return any(
            v is not None
            for v in (self.prompt, self.prompt_file, self.prompt_template, self.prompt_template_file)
        )


#: The environment variable that sets ``[store] url`` (and wins over the file, so the URL with its
#: password can stay out of files).
STORE_URL_ENV = "MEMACTORS_STORE_URL"


@attrs.frozen
class StoreConfig:
    """``[store] path``: the state directory (operator tokens, the daemon lock, daemon.json, daemon_id,
    and the SQLite database unless ``url`` is set), ``~`` already expanded. ``[store] url`` (or
    ``MEMACTORS_STORE_URL``): a ``postgresql://`` URL putting the store in PostgreSQL (docs/fleet.md);
    its password is never shown (`mask_url`)."""

    path: Path
    url: str | None = attrs.field(default=None, repr=lambda u: repr(mask_url(u)) if u else "None")


@attrs.frozen
class ListenConfig:
    """A ``listen = "host:port"`` key; port 0 asks the OS for a free port."""

    host: str
    port: int

    @property
    def address(self) -> str:
        """The value as written back: ``host:port``, with IPv6 hosts in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@attrs.frozen
class ConsoleConfig:
    """``[console]``: the web console's own loopback listener, off unless ``enabled``.

    Off by default: it is the one surface a web browser talks to, and a browser is the one client any
    page the operator opens can steer (forged form posts, DNS rebinding), so serving it is the
    operator's choice; and a daemon upgraded in place must not start failing because the new port is
    taken on its host.
    """

    enabled: bool = False
    listen: ListenConfig = ListenConfig("127.0.0.1", 7379)


@attrs.frozen
class TelemetryConfig:
    """``[telemetry]`` (REQ-18)."""

    export_all: bool = False


@attrs.frozen
class Config:
    """The whole loaded configuration; ``source`` lists every file read, in merge order."""

    memory: MemoryConfig = attrs.Factory(MemoryConfig)
    model_api: ModelApiConfig | None = None
    mcp: Mapping[str, McpServerConfig] = _EMPTY
    mcp_defaults: McpDefaults = attrs.Factory(McpDefaults)
    mcp_policy: Mapping[str, McpPolicy] = _EMPTY
    harness: Mapping[str, HarnessConfig] = _EMPTY
    store: StoreConfig = attrs.Factory(lambda: StoreConfig(Path("~/.local/share/harness").expanduser()))
    operator: ListenConfig = ListenConfig("127.0.0.1", 7377)
    gateway: ListenConfig = ListenConfig("127.0.0.1", 7378)
    metrics: ListenConfig = ListenConfig("127.0.0.1", 9477)
    console: ConsoleConfig = attrs.Factory(ConsoleConfig)
    telemetry: TelemetryConfig = attrs.Factory(TelemetryConfig)
    source: tuple[Path, ...] = ()
    #: The global file this configuration was loaded for (read or not), so a run can load the same
    #: configuration again with its repository's project file (``memactors run``).
    global_path: Path | None = None

    @property
    def episodes(self) -> EpisodesConfig:
        """Shortcut for ``memory.episodes``."""
        return self.memory.episodes

    @property
    def provider_upstream(self) -> McpServerConfig | None:
        """The ``[mcp.<name>]`` upstream serving as memory provider; None for the built-in one."""
        if self.memory.is_builtin:
            return None
        return self.mcp[self.memory.provider]
