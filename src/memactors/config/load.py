"""Loading and validating the configuration: the global file, its ``harness_d`` drop-ins and project
files merged (``_toml_tables``), each table built into its model (``config.models``), and every failure
a ConfigError naming file, key and value. Project files may only set what SPEC-0030 leaves to a
project (REQ-1, REQ-2, REQ-16, REQ-20)."""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import attrs

# The file-reading machinery (merging, typed reads that name file, key and value), under the private
# names this module's builders use.
from .._toml_tables import Sources as _Sources
from .._toml_tables import Table as _Table
from .._toml_tables import frozen_map as _frozen_map
from .._toml_tables import key_name as _key_name
from .._toml_tables import read_toml as _read_toml
from .._toml_tables import show as _show
from .._toml_tables import table_name as _table_name
from ..errors import ConfigError
from ..urls import mask_url
from .models import (
    DEFAULT_VERIFY_PATTERNS,
    RELEVANCE_FLOOR,
    STORE_URL_ENV,
    Config,
    ConsoleConfig,
    EpisodesConfig,
    HarnessConfig,
    ListenConfig,
    McpDefaults,
    McpPolicy,
    McpServerConfig,
    MemoryConfig,
    ModelApiConfig,
    Origin,
    StoreConfig,
    TelemetryConfig,
)
from .paths import default_config_path, default_state_path, expand_user

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
#: ``[harness.*]`` keys accepted only in the global file and drop-ins: REQ-16's briefing, and a template's
#: ``{{untrusted event.<x>}}`` fields (REQ-20).
GLOBAL_ONLY_HARNESS_KEYS = ("memory_briefing", "untrusted_inline")


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
    store = StoreConfig(expand_user(store_text, env, store_base), url=store_url)
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
    writes on the primary only."""
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
    match exposure:
        case "eager" | "lazy":
            pass
        case _:
            raise t.error("exposure", exposure, 'must be "eager" or "lazy"')
    assert default_policy is not None
    defaults = McpDefaults(default_policy=default_policy, exposure=exposure)
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
            tpath = expand_user(prompts["prompt_template_file"], env, declared_in.parent)
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
    from ..adapters import ADAPTER_CAPS

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
