"""Configuration: the global ``harness.toml``, its ``harness_d`` drop-ins and project files.

Files are TOML, read with the stdlib ``tomllib`` into frozen attrs models. The global file is found as
``--config``, else ``$HARNESS_CONFIG``, else ``~/.config/harness/harness.toml``; the drop-ins
``harness_d/*.toml`` beside it are merged over it in lexical order (later wins per key, tables merge
deeply). Project files (a ``harness.toml`` at a repository root) are merged last but may only declare
``[harness.*]`` entries with project-allowed keys and project-only ``[mcp.*]`` upstreams: everything that
widens what agents see or where episodes go (SPEC-0030 REQ-1, REQ-2, REQ-16, REQ-20) is global-only.

Every failure is a :class:`~memactors.errors.ConfigError` whose message names the file, the key (written
like ``[memory.episodes] provider_timeout``) and the offending value, because an operator reads it in a
terminal with no other context. Unknown keys fail too, so a typo never passes silently.
:class:`ConfigHolder` keeps the last good configuration when a reload fails. How files are merged and
tables read (each key's file, typed reads, unknown keys) is ``_toml_tables``; this module says what
the tables mean.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

import attrs

# The file-reading machinery (merging, typed reads that name file, key and value), under the private
# names this module's builders use.
from ._toml_tables import EMPTY as _EMPTY
from ._toml_tables import Sources as _Sources
from ._toml_tables import Table as _Table
from ._toml_tables import frozen_map as _frozen_map
from ._toml_tables import key_name as _key_name
from ._toml_tables import parse_duration
from ._toml_tables import read_toml as _read_toml
from ._toml_tables import show as _show
from ._toml_tables import table_name as _table_name
from .errors import ConfigError
from .urls import mask_url

__all__ = [
    "Config",
    "ConsoleConfig",
    "ConfigHolder",
    "EpisodesConfig",
    "HarnessConfig",
    "ListenConfig",
    "McpDefaults",
    "McpPolicy",
    "McpServerConfig",
    "MemoryConfig",
    "ModelApiConfig",
    "StoreConfig",
    "TelemetryConfig",
    "default_config_path",
    "default_state_path",
    "load_config",
    "parse_duration",
]

Origin = Literal["global", "dropin", "project"]

#: Top-level tables a project file may not set; the key is how an error names them.
GLOBAL_ONLY_TABLES = (
    "memory",
    "model_api",
    "store",
    "operator",
    "gateway",
    "metrics",
    "console",
    "telemetry",
    "mcp_policy",
)
#: ``[harness.*]`` keys accepted only in the global file and drop-ins (REQ-16, SPEC-0017 REQ-14).
GLOBAL_ONLY_HARNESS_KEYS = ("memory_briefing", "untrusted_inline")

#: ``[harness.<name>] verify_patterns`` default: a shell command an agent ran that matches one of these
#: regular expressions is a verify step (its exit status becomes the verify event's ok).
DEFAULT_VERIFY_PATTERNS = (
    r"\bpytest\b",
    r"\bgo\s+test\b",
    r"\bcargo\s+test\b",
    r"\bnpm\s+(?:run\s+)?test\b",
)


# --------------------------------------------------------------------------------------------- models


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
    #: ``relevance_floor`` (issue 38): the built-in provider serves no item scoring below it on its
    #: 0–1 relevance scale (docs/contracts.md); 0 serves every match.
    relevance_floor: float = 0.4  # RELEVANCE_FLOOR

    @property
    def is_builtin(self) -> bool:
        """True when episodes go to the in-process built-in provider (REQ-11)."""
        return self.provider == "builtin"


@attrs.frozen
class ModelApiConfig:
    """``[model_api]`` (ADR-0036): an OpenAI-compatible endpoint for summaries and embeddings."""

    base_url: str
    api_key_env: str | None = None
    utility_model: str | None = None
    embedding_model: str | None = None
    requests_per_minute: int = 60
    daily_requests: int = 2000


@attrs.frozen
class McpServerConfig:
    """``[mcp.<name>]`` (ADR-0035): one upstream, over stdio (``command``) or streamable HTTP (``url``).

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
    #: from the episode memactors gave it, so REQ-9's text check is skipped for it (issue 9; see README
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
    """``[console]`` (issue 29): the web console's own loopback listener, off unless ``enabled``.

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


# ------------------------------------------------------------------------------------- file location


def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    """``$HARNESS_CONFIG`` if set, else ``$XDG_CONFIG_HOME/harness/harness.toml``, else
    ``~/.config/harness/harness.toml`` (``HOME`` from ``env``)."""
    env = os.environ if env is None else env
    named = env.get("HARNESS_CONFIG")
    if named:
        return _expand_user(named, env)
    return _xdg(env, "XDG_CONFIG_HOME", ".config") / "harness" / "harness.toml"


def default_state_path(env: Mapping[str, str] | None = None) -> str:
    """The default ``[store] path``: ``$XDG_STATE_HOME/harness`` when XDG_STATE_HOME is set, else
    ``~/.local/share/harness`` (where state lived before; kept so existing installations find theirs)."""
    env = os.environ if env is None else env
    state_home = env.get("XDG_STATE_HOME", "")
    if state_home and Path(state_home).is_absolute():
        return str(Path(state_home) / "harness")
    return "~/.local/share/harness"


def _xdg(env: Mapping[str, str], name: str, fallback: str) -> Path:
    """An XDG base directory: the variable when it holds an absolute path (relative ones are ignored,
    as the XDG spec says), else ``~/<fallback>``."""
    value = env.get(name, "")
    if value and Path(value).is_absolute():
        return Path(value)
    return _home(env) / fallback


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    return Path(home) if home else Path.home()


def _expand_user(text: str, env: Mapping[str, str], base: Path | None = None) -> Path:
    """``~`` and ``~/x`` from ``env``'s HOME; a relative path is taken relative to ``base``."""
    if text == "~" or text.startswith("~/"):
        path = _home(env) / text[2:] if text != "~" else _home(env)
    else:
        path = Path(text).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    return path


# ------------------------------------------------------------------------------------------- loading


_LISTEN = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]\s]+)):(?P<port>\d{1,5})")


def _listen(t: _Table, key: str, default: str) -> ListenConfig:
    text = t.str_(key, default)
    assert text is not None
    parsed = _parse_listen(text)
    if parsed is None:
        raise t.error(key, text, 'must be "host:port" with a port from 0 to 65535')
    return parsed


def _parse_listen(text: str) -> ListenConfig | None:
    m = _LISTEN.fullmatch(text)
    if m is None:
        return None
    port = int(m.group("port"))
    if port > 65535:
        return None
    return ListenConfig(m.group("v6") or m.group("host"), port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_UNTRUSTED_EVENT = re.compile(r"\{\{\s*untrusted\s+event\.[A-Za-z0-9_.\-\[\]]+\s*\}\}")


def load_config(
    path: Path | None = None,
    *,
    project_files: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
) -> Config:
    """Load the global file (``path``, else :func:`default_config_path`), its drop-ins and project files.

    A missing global file at the default location means every default; a missing file that was named
    (``path`` or ``$HARNESS_CONFIG``) is an error, since the operator meant a file. Drop-ins in
    ``harness_d/`` beside the global file are read even when the global file is absent. Raises
    ConfigError naming file, key and value on any problem.
    """
    env = os.environ if env is None else env
    named = path is not None or bool(env.get("HARNESS_CONFIG"))
    global_path = Path(path) if path is not None else default_config_path(env)
    sources = _Sources(fallback=global_path)
    read: list[Path] = []
    origins: dict[tuple[str, str], tuple[Origin, Path]] = {}

    if global_path.is_file():
        doc = _read_toml(global_path)
        _note_origins(doc, "global", global_path, origins)
        sources.merge(doc, global_path)
        read.append(global_path)
    elif named:
        raise ConfigError(f"{global_path}: configuration file not found", file=str(global_path))

    dropin_dir = global_path.parent / "harness_d"
    if dropin_dir.is_dir():
        for dropin in sorted(dropin_dir.glob("*.toml"), key=lambda p: p.name):
            if not dropin.is_file():
                continue
            doc = _read_toml(dropin)
            _note_origins(doc, "dropin", dropin, origins)
            sources.merge(doc, dropin)
            read.append(dropin)

    global_mcp = {name for table, name in origins if table == "mcp"}
    for project in project_files:
        project = Path(project)
        doc = _read_toml(project)
        _check_project(doc, project, global_mcp)
        _note_origins(doc, "project", project, origins)
        sources.merge(doc, project)
        read.append(project)

    return attrs.evolve(_build(sources, origins, env, tuple(read)), global_path=global_path)


def _note_origins(
    doc: Mapping[str, Any], origin: Origin, file: Path, origins: dict[tuple[str, str], tuple[Origin, Path]]
) -> None:
    """Remember the first file declaring each ``[mcp.<name>]`` and ``[harness.<name>]``."""
    for table in ("mcp", "harness"):
        body = doc.get(table)
        if isinstance(body, dict):
            for name, value in body.items():
                if isinstance(value, dict):
                    origins.setdefault((table, name), (origin, file))


def _project_error(file: Path, name: str, value: object, reason: str) -> ConfigError:
    return ConfigError(f"{file}: {name} = {_show(value)}: {reason}", file=str(file), key=name, value=value)


def _check_project(doc: Mapping[str, Any], file: Path, global_mcp: set[str]) -> None:
    """Reject what a project file may not say: global-only tables and keys, and unknown tables."""
    for table, body in doc.items():
        if table in GLOBAL_ONLY_TABLES:
            name = _table_name([table])
            if table in ("memory", "mcp_policy") and isinstance(body, dict) and body:
                sub = next(iter(body))
                if isinstance(body[sub], dict):
                    name = _table_name([table, sub])
            raise ConfigError(
                f"{file}: {name} is global-only: set it in the global harness.toml or a harness_d drop-in,"
                " not in a project file",
                file=str(file),
                key=name,
                value=sorted(body) if isinstance(body, dict) else body,
            )
        if table == "mcp":
            if not isinstance(body, dict):
                raise _project_error(file, "[mcp]", body, "must be a table")
            for name, server in body.items():
                if not isinstance(server, dict):
                    key = _key_name(["mcp"], name)
                    raise ConfigError(
                        f"{file}: {key} = {_show(server)}: {key} is global-only, not allowed in a project"
                        " file",
                        file=str(file),
                        key=key,
                        value=server,
                    )
                if name in global_mcp:
                    key = _table_name(["mcp", name])
                    raise ConfigError(
                        f"{file}: {key}: already declared in the global configuration; a project file"
                        " may only add upstreams of its own",
                        file=str(file),
                        key=key,
                        value=name,
                    )
        elif table == "harness":
            if not isinstance(body, dict):
                raise _project_error(file, "[harness]", body, "must be a table")
            for hname, entry in body.items():
                if not isinstance(entry, dict):
                    continue  # reported with the type error by the builder
                for key in GLOBAL_ONLY_HARNESS_KEYS:
                    if key in entry:
                        name = _key_name(["harness", hname], key)
                        raise ConfigError(
                            f"{file}: {name} = {_show(entry[key])}: {key} is global-only: set it in the"
                            " global harness.toml or a harness_d drop-in, not in a project file",
                            file=str(file),
                            key=name,
                            value=entry[key],
                        )
        # Any other table is unknown; the builder reports it with its file.


_KNOWN_TABLES = (
    "memory",
    "model_api",
    "mcp",
    "mcp_policy",
    "harness",
    "store",
    "operator",
    "gateway",
    "metrics",
    "console",
    "telemetry",
)


def _build(
    sources: _Sources,
    origins: Mapping[tuple[str, str], tuple[Origin, Path]],
    env: Mapping[str, str],
    read: tuple[Path, ...],
) -> Config:
    root = _Table(sources, (), sources.data)
    for table in sources.data:
        if table not in _KNOWN_TABLES:
            file = sources.file_of((table,))
            name = _table_name([table])
            raise ConfigError(f"{file}: {name}: unknown table", file=str(file), key=name, value=table)
        if not isinstance(sources.data[table], dict):
            raise root.error(table, sources.data[table], "must be a table")

    memory_t = root.sub("memory")
    episodes_t = memory_t.sub("episodes")
    retention, retention_text = episodes_t.duration("retention", "90d")
    provider_timeout, provider_timeout_text = episodes_t.duration("provider_timeout", "2s")
    episodes = EpisodesConfig(
        retention=retention,
        summary=episodes_t.bool_("summary", True),
        provider_timeout=provider_timeout,
        excerpt_chars=episodes_t.int_("excerpt_chars", 600, 0, 2000),
        retention_text=retention_text,
        provider_timeout_text=provider_timeout_text,
    )
    episodes_t.finish()
    provider = memory_t.str_("provider", "builtin")
    assert provider is not None
    embeddings = memory_t.bool_("embeddings", True)
    relevance_floor = memory_t.fraction("relevance_floor", RELEVANCE_FLOOR)
    memory_t.finish()

    model_api = _build_model_api(root)
    servers, defaults = _build_mcp(root, origins)
    policies = _build_policies(root, defaults)
    harnesses = _build_harnesses(root, origins, env)

    store_t = root.sub("store")
    store_text = store_t.str_("path", default_state_path(env))
    assert store_text is not None
    if not store_text:
        raise store_t.error("path", store_text, "must not be empty")
    store_base = sources.file_of(("store", "path")).parent if store_t.has("path") else None
    store_url = store_t.str_("url", None)
    url_key = "url"
    if env.get(STORE_URL_ENV):
        store_url, url_key = env[STORE_URL_ENV], STORE_URL_ENV
    if store_url is not None:
        reason = store_url_problem(store_url)
        if reason is not None:
            if url_key == STORE_URL_ENV:
                raise ConfigError(f"{STORE_URL_ENV}={_show(mask_url(store_url))}: {reason}", key=STORE_URL_ENV)
            raise store_t.error("url", mask_url(store_url), reason)
    store = StoreConfig(_expand_user(store_text, env, store_base), url=store_url)
    store_t.finish()

    listeners = {}
    for table, default in (
        ("operator", "127.0.0.1:7377"),
        ("gateway", "127.0.0.1:7378"),
        ("metrics", "127.0.0.1:9477"),
    ):
        t = root.sub(table)
        listeners[table] = _listen(t, "listen", default)
        t.finish()

    console_t = root.sub("console")
    console_enabled = console_t.bool_("enabled", False)
    console_listen = _listen(console_t, "listen", "127.0.0.1:7379")
    if not _is_loopback(console_listen.host):
        raise console_t.error("listen", console_listen.address,
                              "must be a loopback address (127.0.0.1, [::1] or localhost): the console is "
                              "for a browser on this machine")
    console_t.finish()

    telemetry_t = root.sub("telemetry")
    telemetry = TelemetryConfig(export_all=telemetry_t.bool_("export_all", False))
    telemetry_t.finish()

    _check_provider(memory_t, provider, servers, policies, sources)

    return Config(
        memory=MemoryConfig(provider=provider, episodes=episodes, embeddings=embeddings,
                            relevance_floor=relevance_floor),
        model_api=model_api,
        mcp=_frozen_map(servers),
        mcp_defaults=defaults,
        mcp_policy=_frozen_map(policies),
        harness=_frozen_map(harnesses),
        store=store,
        operator=listeners["operator"],
        gateway=listeners["gateway"],
        metrics=listeners["metrics"],
        console=ConsoleConfig(enabled=console_enabled, listen=console_listen),
        telemetry=telemetry,
        source=read,
    )


def store_url_problem(url: str) -> str | None:
    """Why `url` cannot be a store URL, or None. Only PostgreSQL is a store engine besides the SQLite
    file: ``postgresql://[user[:password]@][host][:port][,host2[:port2]…]/dbname[?param=value…]`` — the
    libpq multi-host form finds the primary after a failover (docs/fleet.md). A
    ``target_session_attrs`` that would let the daemon use a standby is refused: memactors reads and
    writes on the primary only (issue 28)."""
    if not url.startswith(("postgresql://", "postgres://")):
        return 'must be a PostgreSQL URL: "postgresql://user@host:5432/dbname" (leave it out for SQLite)'
    try:
        parts = urlsplit(url)
        if "," not in parts.netloc:
            parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
        else:
            problem = _hosts_problem(parts.netloc.rpartition("@")[2])
            if problem:
                return problem
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if not parts.path.strip("/") and "dbname=" not in parts.query:
        return "must name a database: postgresql://user@host:5432/dbname"
    attrs_given = [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "target_session_attrs"]
    for value in attrs_given:
        if value not in _PRIMARY_ONLY:
            return (f"has target_session_attrs={value}, which lets the daemon use a server that is not the "
                    "primary; memactors reads and writes on the primary only: use target_session_attrs="
                    "read-write (the default) or primary")
    return None


#: The ``target_session_attrs`` a store URL may name: both mean the primary.
_PRIMARY_ONLY = ("read-write", "primary")


def _hosts_problem(hosts: str) -> str | None:
    """What is wrong with the ``host1:port1,host2:port2`` list of a libpq multi-host URL, or None."""
    for item in hosts.split(","):
        host, port = item, ""
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        elif ":" in item:
            host, _, port = item.rpartition(":")
        if not host:
            return f"has an empty host in its host list {hosts!r}: postgresql://user@h1:5432,h2:5432/dbname"
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            return f"has port {port!r} for host {host!r}, not a number from 1 to 65535"
    return None


def _build_model_api(root: _Table) -> ModelApiConfig | None:
    if not root.has("model_api"):
        return None
    t = root.sub("model_api")
    base_url = t.str_("base_url", required=True)
    assert base_url is not None
    if not base_url.startswith(("http://", "https://")):
        raise t.error("base_url", base_url, "must be an http:// or https:// URL")
    api = ModelApiConfig(
        base_url=base_url,
        api_key_env=t.str_("api_key_env"),
        utility_model=t.str_("utility_model"),
        embedding_model=t.str_("embedding_model"),
        requests_per_minute=t.int_("requests_per_minute", 60, 1),
        daily_requests=t.int_("daily_requests", 2000, 1),
    )
    t.finish()
    return api


def _build_mcp(
    root: _Table, origins: Mapping[tuple[str, str], tuple[Origin, Path]]
) -> tuple[dict[str, McpServerConfig], McpDefaults]:
    t = root.sub("mcp")
    default_policy = t.str_("default_policy", "default")
    exposure = t.str_("exposure", "eager")
    if exposure not in ("eager", "lazy"):
        raise t.error("exposure", exposure, 'must be "eager" or "lazy"')
    assert default_policy is not None
    defaults = McpDefaults(default_policy=default_policy, exposure=exposure)  # type: ignore[arg-type]
    servers: dict[str, McpServerConfig] = {}
    for name, body in t.data.items():
        if name in t.used:
            continue
        if not isinstance(body, dict):
            raise t.error(name, body, "unknown key")
        s = t.sub(name)
        command = s.str_("command")
        url = s.str_("url")
        if (command is None) == (url is None):
            raise s.error(
                None, body, "needs exactly one of command (stdio) or url (streamable HTTP)", show_value=False
            )
        if command is not None and not command:
            raise s.error("command", command, "must not be empty")
        if url is not None and not url.startswith(("http://", "https://")):
            raise s.error("url", url, "must be an http:// or https:// URL")
        args = s.str_list("args")
        env = s.str_map("env")
        headers = s.str_map("headers")
        if url is not None:
            for key in ("args", "env"):
                if s.has(key):
                    raise s.error(
                        key,
                        s.data[key],
                        "applies only to a command (stdio) upstream",
                        show_value=key == "args",
                    )
        if command is not None and s.has("headers"):
            raise s.error(
                "headers", s.data["headers"], "applies only to a url (HTTP) upstream", show_value=False
            )
        origin, origin_file = origins[("mcp", name)]
        servers[name] = McpServerConfig(
            name=name,
            origin=origin,
            origin_file=origin_file,
            command=command,
            args=args,
            env=env,
            url=url,
            headers=headers,
            shared=s.bool_("shared", True),
            own_text=s.bool_("own_text", False),
            spare_process=s.bool_("spare_process", True),
        )
        s.finish()
    return servers, defaults


def _build_policies(root: _Table, defaults: McpDefaults) -> dict[str, McpPolicy]:
    t = root.sub("mcp_policy")
    policies: dict[str, McpPolicy] = {}
    for name in list(t.data):
        p = t.sub(name)
        policies[name] = McpPolicy(name=name, servers=p.str_list("servers"))
        p.finish()
    if defaults.default_policy != "default" and defaults.default_policy not in policies:
        raise root.sub("mcp").error(
            "default_policy", defaults.default_policy, "names no [mcp_policy.<name>] table"
        )
    return policies


_PROMPT_KEYS = ("prompt", "prompt_file", "prompt_template", "prompt_template_file")


def _build_harnesses(
    root: _Table, origins: Mapping[tuple[str, str], tuple[Origin, Path]], env: Mapping[str, str]
) -> dict[str, HarnessConfig]:
    t = root.sub("harness")
    harnesses: dict[str, HarnessConfig] = {}
    sources = root.sources
    for name in list(t.data):
        h = t.sub(name)
        adapter = h.str_("harness", required=True)
        assert adapter is not None
        record_trace = h.bool_("record_trace", True)
        memory_record = h.bool_("memory_record", True)
        explicit = h.has("memory_record")
        if not record_trace and explicit and memory_record:
            raise h.error(
                "memory_record",
                True,
                "would do nothing: this harness sets record_trace = false, so it records no episode",
            )
        untrusted_inline = h.bool_("untrusted_inline", False)
        prompts = {k: h.str_(k) for k in _PROMPT_KEYS}
        set_keys = [k for k, v in prompts.items() if v is not None]
        if len(set_keys) > 1:
            raise h.error(
                set_keys[1],
                prompts[set_keys[1]],
                f"set at most one of {', '.join(_PROMPT_KEYS)} (also set: {set_keys[0]})",
            )
        template = prompts["prompt_template"]
        template_key = "prompt_template"
        if prompts["prompt_template_file"] is not None:
            template_key = "prompt_template_file"
            declared_in = sources.file_of(("harness", name, "prompt_template_file"))
            tpath = _expand_user(prompts["prompt_template_file"], env, declared_in.parent)
            try:
                template = tpath.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise h.error(
                    "prompt_template_file",
                    prompts["prompt_template_file"],
                    f"cannot be read ({tpath}): {getattr(exc, 'strerror', None) or exc}",
                ) from exc
        if template is not None and not untrusted_inline:
            m = _UNTRUSTED_EVENT.search(template)
            if m is not None:
                raise h.error(
                    "untrusted_inline",
                    False,
                    f"{template_key} references {m.group(0)}, which needs untrusted_inline = true"
                    " (memory_briefing does not open the event fence)",
                )
        harnesses[name] = HarnessConfig(
            name=name,
            harness=adapter,
            origin=origins[("harness", name)][0],
            workdir=h.str_("workdir"),
            memory_record=memory_record,
            memory_record_explicit=explicit,
            record_trace=record_trace,
            memory_briefing=h.bool_("memory_briefing", False),
            briefing_max_chars=h.int_("briefing_max_chars", 2000, 500, 4000),
            untrusted_inline=untrusted_inline,
            prompt=prompts["prompt"],
            prompt_file=prompts["prompt_file"],
            prompt_template=prompts["prompt_template"],
            prompt_template_file=prompts["prompt_template_file"],
            template_text=template,
            args=h.str_list("args"),
            **_run_keys(h, adapter),
            export_telemetry=h.bool_("export_telemetry", False),
        )
        h.finish()
    return harnesses


#: The largest ``max_turns`` and ``max_cost_usd`` accepted (a typo's extra zeros are an error, not a cap).
MAX_TURNS_LIMIT = 10_000
MAX_COST_LIMIT = 10_000.0


def _caps(h: _Table, adapter: str) -> tuple[int | None, float | None]:
    """``max_turns`` and ``max_cost_usd``, each checked and refused for an adapter that cannot honour it
    (a cap that would silently do nothing is a configuration error, not a no-op)."""
    from .adapters import ADAPTER_CAPS

    max_turns = h.int_("max_turns", 0, 1, MAX_TURNS_LIMIT) if h.has("max_turns") else None
    max_cost: float | None = None
    if h.has("max_cost_usd"):
        value = h.raw("max_cost_usd")
        if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
                or not 0 < value <= MAX_COST_LIMIT):
            raise h.error("max_cost_usd", value, f"must be a number of US dollars above 0, at most {MAX_COST_LIMIT:g}")
        max_cost = float(value)
    supported = ADAPTER_CAPS.get(adapter, frozenset())
    able = sorted(name for name, caps in ADAPTER_CAPS.items() if caps)
    for key, value in (("max_turns", max_turns), ("max_cost_usd", max_cost)):
        if value is not None and key not in supported:
            raise h.error(key, value, f"the {adapter} adapter cannot enforce it: its agent reports no "
                                      f"{'turns' if key == 'max_turns' else 'cost'} to memactors and takes no "
                                      f"such limit (adapters that can: {', '.join(able)})")
    return max_turns, max_cost


def _run_keys(h: _Table, adapter: str) -> dict[str, Any]:
    """The keys ``memactors run`` reads to run a harness headless (docs/runs.md)."""
    command = h.str_("command")
    if command is not None and not command.strip():
        raise h.error("command", command, "must not be empty")
    permission_mode = h.str_("permission_mode")
    model = h.str_("model")
    for key, value in (("permission_mode", permission_mode), ("model", model)):
        if value is not None and not value.strip():
            raise h.error(key, value, "must not be empty")
    timeout, timeout_text = h.duration("timeout", "30m")
    patterns: tuple[str, ...] = DEFAULT_VERIFY_PATTERNS
    if h.has("verify_patterns"):
        patterns = h.str_list("verify_patterns")
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise h.error("verify_patterns", pattern, f"is not a regular expression: {exc}") from None
    max_turns, max_cost_usd = _caps(h, adapter)
    return dict(
        max_turns=max_turns,
        max_cost_usd=max_cost_usd,
        command=command,
        allowed_tools=h.str_list("allowed_tools"),
        permission_mode=permission_mode,
        model=model,
        extra_args=h.str_list("extra_args"),
        timeout=timeout,
        timeout_text=timeout_text,
        verify_patterns=patterns,
    )


def _check_provider(
    memory_t: _Table,
    provider: str,
    servers: Mapping[str, McpServerConfig],
    policies: Mapping[str, McpPolicy],
    sources: _Sources,
) -> None:
    """REQ-1 and REQ-2: the provider is builtin or a shared global upstream that no policy exposes."""
    if provider == "builtin":
        return
    server = servers.get(provider)
    if server is None:
        raise memory_t.error(
            "provider",
            provider,
            'must be "builtin" or the name of an [mcp.<name>] upstream in the global file'
            " or a harness_d drop-in",
        )
    if server.origin == "project":
        raise memory_t.error(
            "provider",
            provider,
            f"{_table_name(['mcp', provider])} is declared only in project file"
            f" {server.origin_file}; the provider must be a global upstream",
        )
    for policy in policies.values():
        if provider in policy.servers:
            file = sources.file_of(("mcp_policy", policy.name, "servers"))
            name = _table_name(["mcp_policy", policy.name])
            raise ConfigError(
                f"{file}: {name} servers = {_show(list(policy.servers))}: names {provider}, the memory"
                " provider, which is reserved to the daemon and may not appear in any policy",
                file=str(file),
                key=name,
                value=provider,
            )
    if not server.shared:
        t = _Table(sources, ("mcp", provider), None)
        raise t.error(
            "shared",
            False,
            f"{provider} is the memory provider and must be shared: episodes from every harness"
            " go to one store",
        )


def config_fingerprint(global_path: Path | None) -> tuple[tuple[str, int, int, int, int], ...]:
    """What the global configuration looks like on disk, to notice an edit (issue 26): (path, inode,
    size, mtime_ns, ctime_ns) of the global file, of its ``harness_d`` directory and of every
    ``harness_d/*.toml``. A file added, removed, replaced or written changes it. Project files are not in
    it: each run reads its repository's file when it starts. Reads no file's content."""
    if global_path is None:
        return ()
    out: list[tuple[str, int, int, int, int]] = []
    dropins = global_path.parent / "harness_d"
    paths = [global_path, dropins]
    try:
        paths += sorted(dropins.glob("*.toml"))
    except OSError:
        pass
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue  # absent: its absence is the fingerprint (a file that appears changes it)
        out.append((str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


class ConfigHolder:
    """Holds the last good configuration; a reload that fails leaves it in force (REQ-1).

    The first load happens in the constructor, so a daemon without a valid configuration does not
    start. ``loader`` is a zero-argument callable, usually ``functools.partial(load_config, path, ...)``.
    It reads files, so a trio caller runs ``reload`` in ``trio.to_thread.run_sync``.

    ``seen`` is the files' :func:`config_fingerprint` as the last load or reload attempt found them (a
    failed one too, so a broken file is tried once, not at every look); the daemon's watch compares it
    with the files now and reloads when they differ. ``state()`` says when the configuration in force was
    loaded and why the last reload failed, for doctor.
    """

    def __init__(self, loader: Callable[[], Config]) -> None:
        from loguru import logger  # here, not at the top: the CLI loads configs without logging

        self._loader = loader
        self._current = loader()
        self.seen = config_fingerprint(self._current.global_path)
        self.loaded_at = _now_iso()
        self.reloads = 0
        #: The last failed reload: (when, the error), None once a reload succeeds again.
        self.failure: tuple[str, str] | None = None
        logger.bind(files=len(self._current.source), outcome="loaded").info("configuration loaded")

    def state(self) -> dict[str, Any]:
        """When the configuration in force was loaded, from which files, and the last reload failure."""
        failure = self.failure
        return {"loaded_at": self.loaded_at, "files": [str(p) for p in self._current.source],
                "global_path": str(self._current.global_path) if self._current.global_path else None,
                "reloads": self.reloads, "failed_at": failure[0] if failure else None,
                "error": failure[1] if failure else None}

    @property
    def current(self) -> Config:
        """The configuration in force: the last one that loaded without error."""
        return self._current

    def reload(self) -> Config:
        """Load again; on success replace and return the new configuration.

        Raises ConfigError when the new files do not load, and keeps ``current`` unchanged.
        """
        from loguru import logger

        self.seen = config_fingerprint(self._current.global_path)
        try:
            config = self._loader()
        except ConfigError as exc:
            self.failure = (_now_iso(), str(exc))
            logger.bind(
                file=exc.context.get("file"), key=exc.context.get("key"), outcome="kept_last_good"
            ).warning("configuration reload failed; keeping the last good configuration")
            raise
        self._current = config
        self.loaded_at, self.failure = _now_iso(), None
        self.reloads += 1
        logger.bind(files=len(config.source), harnesses=len(config.harness),
                    outcome="reloaded").info("configuration reloaded")
        return config


def _now_iso() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
