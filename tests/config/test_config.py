"""Configuration loading: global file, drop-ins, project files, and every rule SPEC-0030 puts on them."""

from __future__ import annotations

import functools
from pathlib import Path

import attrs
import pytest

from memactors.config import (
    Config,
    ConfigHolder,
    ListenConfig,
    default_config_path,
    load_config,
    parse_duration,
)
from memactors.errors import ConfigError


@attrs.define
class Layout:
    """A config directory in tmp_path: the global file, its harness_d, and a repository."""

    root: Path

    @property
    def global_file(self) -> Path:
        return self.root / "etc" / "harness.toml"

    def write_global(self, text: str) -> Path:
        self.global_file.parent.mkdir(parents=True, exist_ok=True)
        self.global_file.write_text(text)
        return self.global_file

    def write_dropin(self, name: str, text: str) -> Path:
        path = self.global_file.parent / "harness_d" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def write_project(self, text: str, repo: str = "repo") -> Path:
        path = self.root / repo / "harness.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def load(self, *projects: Path) -> Config:
        return load_config(self.global_file, project_files=projects, env={"HOME": str(self.root / "home")})


@pytest.fixture
def cfg(tmp_path: Path) -> Layout:
    layout = Layout(tmp_path)
    layout.write_global("")
    return layout


def fails(layout: Layout, *projects: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        layout.load(*projects)
    return info.value


# ------------------------------------------------------------------------------------------- REQ-1


@pytest.mark.req1
def test_req1_the_default_needs_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    config = load_config(env={"HOME": str(home)})
    assert config.memory.provider == "builtin"
    assert config.memory.is_builtin
    assert config.provider_upstream is None
    assert config.episodes.retention == 90 * 86400
    assert config.episodes.retention_text == "90d"
    assert config.episodes.summary is True
    assert config.episodes.provider_timeout == 2.0
    assert config.episodes.excerpt_chars == 600
    assert config.model_api is None
    assert dict(config.mcp) == {} and dict(config.mcp_policy) == {} and dict(config.harness) == {}
    assert config.mcp_defaults.default_policy == "default"
    assert config.mcp_defaults.exposure == "eager"
    assert config.store.path == home / ".local" / "share" / "harness"
    assert config.operator == ListenConfig("127.0.0.1", 7377)
    assert config.gateway == ListenConfig("127.0.0.1", 7378)
    assert config.metrics == ListenConfig("127.0.0.1", 9477)
    assert config.telemetry.export_all is False
    assert config.source == ()


@pytest.mark.req1
def test_req1_an_empty_global_file_is_all_defaults(cfg: Layout) -> None:
    cfg.write_global("")
    config = cfg.load()
    assert config.memory.provider == "builtin"
    assert config.source == (cfg.global_file,)


@pytest.mark.req1
def test_req1_a_provider_must_be_a_global_upstream(cfg: Layout) -> None:
    cfg.write_global('[mcp.zep]\nurl = "http://127.0.0.1:9000/mcp"\n')
    project = cfg.write_project('[mcp.mem0]\ncommand = "mem0-mcp"\n')
    holder = ConfigHolder(functools.partial(cfg.load, project))
    good = holder.current
    assert good.memory.provider == "builtin"
    assert good.mcp["mem0"].origin == "project"

    cfg.write_global('[memory]\nprovider = "mem0"\n\n[mcp.zep]\nurl = "http://127.0.0.1:9000/mcp"\n')
    with pytest.raises(ConfigError) as info:
        holder.reload()
    message = str(info.value)
    assert "[memory] provider" in message and "mem0" in message
    assert info.value.context["key"] == "[memory] provider"
    assert info.value.context["value"] == "mem0"
    assert info.value.context["file"] == str(cfg.global_file)
    assert holder.current is good

    cfg.write_global('[memory]\nprovider = "zep"\n\n[mcp.zep]\nurl = "http://127.0.0.1:9000/mcp"\n')
    reloaded = holder.reload()
    assert holder.current is reloaded and reloaded.memory.provider == "zep"


@pytest.mark.req1
def test_req1_an_unknown_provider_fails_naming_key_and_value(cfg: Layout) -> None:
    cfg.write_global('[memory]\nprovider = "letta"\n')
    err = fails(cfg)
    assert "[memory] provider" in err.message and '"letta"' in err.message
    assert str(cfg.global_file) in err.message


@pytest.mark.req1
def test_req1_an_empty_provider_is_not_builtin(cfg: Layout) -> None:
    cfg.write_global('[memory]\nprovider = ""\n')
    assert "[memory] provider" in fails(cfg).message


@pytest.mark.req1
def test_req1_a_dropin_upstream_may_be_the_provider(cfg: Layout) -> None:
    cfg.write_global('[memory]\nprovider = "zep"\n')
    dropin = cfg.write_dropin("10-zep.toml", '[mcp.zep]\ncommand = "zep-mcp"\nargs = ["--stdio"]\n')
    config = cfg.load()
    upstream = config.provider_upstream
    assert upstream is not None and upstream.name == "zep"
    assert upstream.origin == "dropin" and upstream.origin_file == dropin
    assert upstream.transport == "stdio" and upstream.args == ("--stdio",)


@pytest.mark.req1
def test_req1_a_project_file_cannot_redefine_a_global_upstream(cfg: Layout) -> None:
    cfg.write_global('[memory]\nprovider = "zep"\n[mcp.zep]\ncommand = "zep-mcp"\n')
    project = cfg.write_project('[mcp.zep]\ncommand = "evil"\n')
    err = fails(cfg, project)
    assert "[mcp.zep]" in err.message and err.context["file"] == str(project)


@pytest.mark.req1
@pytest.mark.parametrize(
    ("table", "shown"),
    [
        ('[memory]\nprovider = "builtin"\n', "[memory]"),
        ('[memory.episodes]\nretention = "1d"\n', "[memory.episodes]"),
        ('[model_api]\nbase_url = "http://x"\n', "[model_api]"),
        ('[store]\npath = "/tmp/x"\n', "[store]"),
        ('[operator]\nlisten = "0.0.0.0:1"\n', "[operator]"),
        ('[gateway]\nlisten = "0.0.0.0:1"\n', "[gateway]"),
        ('[metrics]\nlisten = "0.0.0.0:1"\n', "[metrics]"),
        ("[telemetry]\nexport_all = true\n", "[telemetry]"),
        ('[mcp_policy.dev]\nservers = ["x"]\n', "[mcp_policy.dev]"),
        ('[mcp]\nexposure = "lazy"\n', "[mcp] exposure"),
    ],
)
def test_req1_global_only_tables_fail_in_a_project_file(cfg: Layout, table: str, shown: str) -> None:
    project = cfg.write_project(table)
    err = fails(cfg, project)
    assert shown in err.message and "global-only" in err.message
    assert err.context["file"] == str(project)


@pytest.mark.req1
def test_req1_episodes_keys_parse(cfg: Layout) -> None:
    cfg.write_global(
        '[memory.episodes]\nretention = "12h"\nsummary = false\nprovider_timeout = "1.5s"\nexcerpt_chars = 0\n'
    )
    episodes = cfg.load().episodes
    assert episodes.retention == 12 * 3600
    assert episodes.summary is False
    assert episodes.provider_timeout == 1.5
    assert episodes.excerpt_chars == 0


@pytest.mark.req1
@pytest.mark.parametrize("value", ["2001", "-1"])
def test_req1_excerpt_chars_out_of_range(cfg: Layout, value: str) -> None:
    cfg.write_global(f"[memory.episodes]\nexcerpt_chars = {value}\n")
    err = fails(cfg)
    assert "[memory.episodes] excerpt_chars" in err.message and value in err.message
    assert "0 to 2000" in err.message


@pytest.mark.req1
@pytest.mark.parametrize("value", ['"2"', '"-2s"', '""', "2", '"2 s"', '"2sec"', '"1e3s"', '"0s"'])
def test_req1_a_bad_duration_names_file_key_and_value(cfg: Layout, value: str) -> None:
    cfg.write_global(f"[memory.episodes]\nprovider_timeout = {value}\n")
    err = fails(cfg)
    assert "[memory.episodes] provider_timeout" in err.message
    assert value in err.message
    assert str(cfg.global_file) in err.message
    assert err.context["key"] == "[memory.episodes] provider_timeout"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90d", 90 * 86400), ("2s", 2), ("500ms", 0.5), ("1.5s", 1.5), ("10m", 600), ("2h", 7200), ("0s", 0)],
)
def test_parse_duration_accepts_the_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "90", "-1s", "1.s", ".5s", "1 s", "1S", "1w", "s"])
def test_parse_duration_rejects_everything_else(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


# ------------------------------------------------------------------------------------------- REQ-2


@pytest.mark.req2
def test_req2_a_policy_cannot_expose_the_provider(cfg: Layout) -> None:
    cfg.write_global(
        '[memory]\nprovider = "zep"\n\n[mcp.zep]\ncommand = "zep-mcp"\n\n[mcp.gitea]\ncommand = "gitea-mcp"\n\n'
        '[mcp_policy.dev]\nservers = ["gitea", "zep"]\n'
    )
    err = fails(cfg)
    assert "[mcp_policy.dev]" in err.message and "zep" in err.message
    assert err.context["key"] == "[mcp_policy.dev]" and err.context["value"] == "zep"


@pytest.mark.req2
def test_req2_a_dropin_policy_naming_the_provider_fails_naming_the_dropin(cfg: Layout) -> None:
    cfg.write_global('[memory]\nprovider = "zep"\n[mcp.zep]\ncommand = "zep-mcp"\n')
    dropin = cfg.write_dropin("50-policy.toml", '[mcp_policy.ops]\nservers = ["zep"]\n')
    err = fails(cfg)
    assert "[mcp_policy.ops]" in err.message and err.context["file"] == str(dropin)


@pytest.mark.req2
def test_req2_the_provider_must_be_shared(cfg: Layout) -> None:
    cfg.write_global('[memory]\nprovider = "zep"\n[mcp.zep]\ncommand = "zep-mcp"\nshared = false\n')
    err = fails(cfg)
    assert "[mcp.zep] shared" in err.message and "false" in err.message


@pytest.mark.req2
def test_req2_an_unshared_upstream_that_is_not_the_provider_is_fine(cfg: Layout) -> None:
    cfg.write_global(
        '[mcp.gitea]\ncommand = "gitea-mcp"\nshared = false\n[mcp_policy.dev]\nservers = ["gitea"]\n'
    )
    config = cfg.load()
    assert config.mcp["gitea"].shared is False
    assert config.mcp_policy["dev"].servers == ("gitea",)


# ------------------------------------------------------------------------------------------- [mcp]


def test_mcp_upstream_keys(cfg: Layout) -> None:
    cfg.write_global(
        '[mcp]\ndefault_policy = "dev"\nexposure = "lazy"\n\n'
        '[mcp.stdio]\ncommand = "srv"\nargs = ["-v"]\nenv = { TOKEN = "secret" }\n\n'
        '[mcp.web]\nurl = "https://mcp.example/mcp"\nheaders = { Authorization = "Bearer x" }\n\n'
        '[mcp_policy.dev]\nservers = ["web"]\n'
    )
    config = cfg.load()
    stdio, web = config.mcp["stdio"], config.mcp["web"]
    assert (stdio.command, stdio.args, dict(stdio.env), stdio.url) == (
        "srv",
        ("-v",),
        {"TOKEN": "secret"},
        None,
    )
    assert (web.url, dict(web.headers), web.command, web.transport) == (
        "https://mcp.example/mcp",
        {"Authorization": "Bearer x"},
        None,
        "http",
    )
    assert stdio.origin == "global" and stdio.origin_file == cfg.global_file
    assert config.mcp_defaults.default_policy == "dev" and config.mcp_defaults.exposure == "lazy"
    with pytest.raises(TypeError):
        config.mcp["x"] = stdio  # type: ignore[index]
    with pytest.raises(TypeError):
        stdio.env["TOKEN"] = "changed"  # type: ignore[index]


def test_mcp_spare_process_defaults_on_and_a_bad_value_names_the_key(cfg: Layout) -> None:
    cfg.write_global('[mcp.a]\ncommand = "srv"\n\n[mcp.b]\ncommand = "srv"\nspare_process = false\n')
    config = cfg.load()
    assert (config.mcp["a"].spare_process, config.mcp["b"].spare_process) == (True, False)
    cfg.write_global('[mcp.b]\ncommand = "srv"\nspare_process = "no"\n')
    err = fails(cfg)
    assert "spare_process" in str(err) and "true or false" in str(err)


@pytest.mark.parametrize("body", ["", 'command = "a"\nurl = "http://b"\n'])
def test_mcp_needs_exactly_one_of_command_or_url(cfg: Layout, body: str) -> None:
    cfg.write_global(f"[mcp.bad]\n{body}")
    err = fails(cfg)
    assert "[mcp.bad]" in err.message and "exactly one of command" in err.message


def test_mcp_bad_exposure(cfg: Layout) -> None:
    cfg.write_global('[mcp]\nexposure = "sometimes"\n')
    err = fails(cfg)
    assert "[mcp] exposure" in err.message and '"sometimes"' in err.message


def test_mcp_default_policy_must_exist_when_named(cfg: Layout) -> None:
    cfg.write_global('[mcp]\ndefault_policy = "nope"\n')
    assert "[mcp] default_policy" in fails(cfg).message


def test_mcp_header_type_errors_do_not_print_values(cfg: Layout) -> None:
    cfg.write_global('[mcp.web]\nurl = "http://x"\nheaders = { Authorization = "Bearer s3cret", N = 1 }\n')
    err = fails(cfg)
    assert "[mcp.web] headers" in err.message and "s3cret" not in str(err)


def test_project_upstreams_are_recorded_as_project(cfg: Layout) -> None:
    cfg.write_global('[mcp.gitea]\ncommand = "gitea-mcp"\n')
    project = cfg.write_project('[mcp.local]\nurl = "http://127.0.0.1:1/mcp"\n')
    config = cfg.load(project)
    assert config.mcp["local"].origin == "project" and config.mcp["local"].origin_file == project
    assert config.mcp["gitea"].origin == "global"
    assert config.source == (cfg.global_file, project)


# ------------------------------------------------------------------------------------------- drop-ins


def test_dropins_merge_in_lexical_order_deeply(cfg: Layout) -> None:
    cfg.write_global(
        '[memory.episodes]\nretention = "30d"\nsummary = false\n\n'
        '[harness.nightly]\nharness = "claude-code"\nprompt = "triage"\n'
    )
    b = cfg.write_dropin("20-b.toml", '[memory.episodes]\nretention = "2d"\n')
    a = cfg.write_dropin(
        "10-a.toml", '[memory.episodes]\nretention = "1d"\n\n[harness.nightly]\nmemory_briefing = true\n'
    )
    (cfg.global_file.parent / "harness_d" / "notes.txt").write_text("[memory]\nprovider = 1\n")
    config = cfg.load()
    assert config.episodes.retention == 2 * 86400  # 20-b wins over 10-a
    assert config.episodes.summary is False  # the global key survives the deep merge
    nightly = config.harness["nightly"]
    assert nightly.harness == "claude-code" and nightly.prompt == "triage" and nightly.memory_briefing is True
    assert nightly.origin == "global"
    assert config.source == (cfg.global_file, a, b)


def test_dropin_errors_name_the_dropin(cfg: Layout) -> None:
    cfg.write_global("")
    dropin = cfg.write_dropin("30-x.toml", '[operator]\nlisten = "localhost"\n')
    err = fails(cfg)
    assert (
        err.context["file"] == str(dropin)
        and "[operator] listen" in err.message
        and '"localhost"' in err.message
    )


def test_dropins_are_read_without_a_global_file(tmp_path: Path) -> None:
    # The default location has no harness.toml, so its drop-ins alone configure the daemon.
    dropins = tmp_path / ".config" / "harness" / "harness_d"
    dropins.mkdir(parents=True)
    (dropins / "10.toml").write_text("[telemetry]\nexport_all = true\n")
    config = load_config(env={"HOME": str(tmp_path)})
    assert config.telemetry.export_all is True and config.source == (dropins / "10.toml",)


# ------------------------------------------------------------------------------------------- files


def test_default_config_path(tmp_path: Path) -> None:
    assert default_config_path({"HOME": str(tmp_path)}) == tmp_path / ".config" / "harness" / "harness.toml"
    assert default_config_path({"HOME": str(tmp_path), "HARNESS_CONFIG": "/etc/h.toml"}) == Path(
        "/etc/h.toml"
    )
    assert default_config_path({"HOME": str(tmp_path), "HARNESS_CONFIG": "~/x.toml"}) == tmp_path / "x.toml"


def test_harness_config_env_is_read(cfg: Layout) -> None:
    cfg.write_global('[gateway]\nlisten = "127.0.0.1:0"\n')
    config = load_config(env={"HOME": str(cfg.root), "HARNESS_CONFIG": str(cfg.global_file)})
    assert config.gateway == ListenConfig("127.0.0.1", 0)


def test_a_named_missing_file_fails(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml", env={})
    assert str(tmp_path / "nope.toml") in info.value.message
    with pytest.raises(ConfigError):
        load_config(env={"HARNESS_CONFIG": str(tmp_path / "nope.toml")})


def test_invalid_toml_names_the_file(cfg: Layout) -> None:
    cfg.write_global("[memory\nprovider = ")
    err = fails(cfg)
    assert err.context["file"] == str(cfg.global_file) and "not valid TOML" in err.message


def test_unknown_keys_and_tables_fail(cfg: Layout) -> None:
    cfg.write_global('[memory]\nprovder = "builtin"\n')
    err = fails(cfg)
    assert "[memory] provder" in err.message and "unknown key" in err.message
    cfg.write_global("[memroy]\n")
    assert "[memroy]" in fails(cfg).message
    cfg.write_global('[harness.a]\nharness = "x"\nmemory_recrod = false\n')
    assert "[harness.a] memory_recrod" in fails(cfg).message
    cfg.write_global('[mcp]\nexpose = "lazy"\n')
    assert "[mcp] expose" in fails(cfg).message


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[memory]\nprovider = 3\n", "[memory] provider"),
        ('[memory.episodes]\nsummary = "yes"\n', "[memory.episodes] summary"),
        ("[memory.episodes]\nexcerpt_chars = 6.5\n", "[memory.episodes] excerpt_chars"),
        ("[memory.episodes]\nexcerpt_chars = true\n", "[memory.episodes] excerpt_chars"),
        ('[telemetry]\nexport_all = "no"\n', "[telemetry] export_all"),
        ('[harness.a]\nharness = "x"\nargs = "--flag"\n', "[harness.a] args"),
        ('[mcp.a]\ncommand = "x"\nargs = [1]\n', "[mcp.a] args"),
        ('[mcp_policy.p]\nservers = "zep"\n', "[mcp_policy.p] servers"),
        ('memory = "builtin"\n', "memory"),
    ],
)
def test_wrong_types_name_file_key_and_value(cfg: Layout, text: str, key: str) -> None:
    cfg.write_global(text)
    err = fails(cfg)
    assert key in err.message and str(cfg.global_file) in err.message


@pytest.mark.parametrize(
    "value", ["localhost", "127.0.0.1:65536", ":80", "127.0.0.1:", "127.0.0.1:-1", "a b:1"]
)
def test_bad_listen_values_fail(cfg: Layout, value: str) -> None:
    cfg.write_global(f'[metrics]\nlisten = "{value}"\n')
    err = fails(cfg)
    assert "[metrics] listen" in err.message and value in err.message


def test_listen_store_and_model_api(cfg: Layout) -> None:
    cfg.write_global(
        '[store]\npath = "~/state"\n[operator]\nlisten = "[::1]:0"\n[metrics]\nlisten = "0.0.0.0:9100"\n'
        '[model_api]\nbase_url = "http://127.0.0.1:8080"\nutility_model = "small"\nrequests_per_minute = 5\n'
    )
    config = cfg.load()
    assert config.store.path == cfg.root / "home" / "state"
    assert config.operator == ListenConfig("::1", 0) and config.operator.address == "[::1]:0"
    assert config.metrics.address == "0.0.0.0:9100"
    api = config.model_api
    assert api is not None and api.utility_model == "small" and api.embedding_model is None
    assert (api.requests_per_minute, api.daily_requests) == (5, 2000)


def test_relative_store_path_is_beside_the_file(cfg: Layout) -> None:
    cfg.write_global('[store]\npath = "state"\n')
    assert cfg.load().store.path == cfg.global_file.parent / "state"


def test_model_api_needs_a_base_url(cfg: Layout) -> None:
    cfg.write_global('[model_api]\nutility_model = "small"\n')
    assert "[model_api] base_url" in fails(cfg).message


# ------------------------------------------------------------------------------------------- harnesses


def test_harness_keys_and_defaults(cfg: Layout) -> None:
    cfg.write_global('[harness.dev]\nharness = "claude-code"\nworkdir = "~/src"\nargs = ["--x"]\n')
    h = cfg.load().harness["dev"]
    assert (h.name, h.harness, h.workdir, h.args, h.origin) == (
        "dev",
        "claude-code",
        "~/src",
        ("--x",),
        "global",
    )
    assert h.memory_record and not h.memory_record_explicit and h.record_trace and h.records_episodes
    assert not h.memory_briefing and not h.untrusted_inline and h.briefing_max_chars == 2000
    assert not h.is_prompt_one_shot


def test_harness_needs_an_adapter(cfg: Layout) -> None:
    cfg.write_global('[harness.dev]\nprompt = "x"\n')
    assert "[harness.dev] harness" in fails(cfg).message


def test_at_most_one_prompt_key(cfg: Layout) -> None:
    cfg.write_global('[harness.dev]\nharness = "x"\nprompt = "a"\nprompt_file = "b.md"\n')
    err = fails(cfg)
    assert "[harness.dev] prompt_file" in err.message and "at most one" in err.message


@pytest.mark.req8
def test_req8_record_trace_false_with_memory_record_true_fails(cfg: Layout) -> None:
    cfg.write_global('[harness.scratch]\nharness = "x"\nrecord_trace = false\nmemory_record = true\n')
    err = fails(cfg)
    assert "[harness.scratch] memory_record" in err.message and "would do nothing" in err.message


@pytest.mark.req8
def test_req8_record_trace_false_alone_records_nothing(cfg: Layout) -> None:
    cfg.write_global(
        '[harness.a]\nharness = "x"\nrecord_trace = false\n'
        '[harness.b]\nharness = "x"\nrecord_trace = false\nmemory_record = false\n'
    )
    config = cfg.load()
    assert not config.harness["a"].records_episodes and not config.harness["a"].memory_record_explicit
    assert not config.harness["b"].records_episodes and config.harness["b"].memory_record_explicit


@pytest.mark.req8
def test_req8_a_project_file_may_opt_a_harness_out(cfg: Layout) -> None:
    cfg.write_global('[harness.scratch]\nharness = "claude-code"\n')
    project = cfg.write_project(
        '[harness.scratch]\nmemory_record = false\n\n[harness.local]\nharness = "codex"\n'
    )
    config = cfg.load(project)
    assert config.harness["scratch"].memory_record is False and config.harness["scratch"].origin == "global"
    assert config.harness["local"].origin == "project"


@pytest.mark.req14
def test_req14_out_of_range_cap(cfg: Layout) -> None:
    cfg.write_global('[harness.dev]\nharness = "x"\nbriefing_max_chars = 10000\n')
    err = fails(cfg)
    assert "[harness.dev] briefing_max_chars" in err.message and "10000" in err.message
    assert "500 to 4000" in err.message


@pytest.mark.req14
@pytest.mark.parametrize(("value", "ok"), [(499, False), (500, True), (4000, True), (4001, False)])
def test_req14_cap_bounds(cfg: Layout, value: int, ok: bool) -> None:
    cfg.write_global(f'[harness.dev]\nharness = "x"\nbriefing_max_chars = {value}\n')
    if ok:
        assert cfg.load().harness["dev"].briefing_max_chars == value
    else:
        assert "500 to 4000" in fails(cfg).message


@pytest.mark.req16
def test_req16_a_project_file_cannot_turn_it_on(cfg: Layout) -> None:
    cfg.write_global('[harness.nightly]\nharness = "claude-code"\n')
    project = cfg.write_project("[harness.nightly]\nmemory_briefing = true\n")
    err = fails(cfg, project)
    assert "memory_briefing" in err.message and "global-only" in err.message
    assert err.context["file"] == str(project) and err.context["key"] == "[harness.nightly] memory_briefing"


@pytest.mark.req16
def test_req16_global_file_may_turn_it_on(cfg: Layout) -> None:
    cfg.write_global(
        '[harness.nightly-triage]\nharness = "claude-code"\nprompt_file = "~/prompts/triage.md"\n'
        "memory_briefing = true\n"
    )
    h = cfg.load().harness["nightly-triage"]
    assert h.memory_briefing and h.is_prompt_one_shot and h.prompt_file == "~/prompts/triage.md"


@pytest.mark.req20
def test_req20_untrusted_inline_is_global_only(cfg: Layout) -> None:
    project = cfg.write_project('[harness.p]\nharness = "x"\nuntrusted_inline = true\n')
    err = fails(cfg, project)
    assert "[harness.p] untrusted_inline" in err.message and "global-only" in err.message


@pytest.mark.req20
def test_req20_memory_briefing_does_not_open_the_event_fence(cfg: Layout) -> None:
    cfg.write_global(
        '[harness.triage]\nharness = "claude-code"\nmemory_briefing = true\n'
        'prompt_template = "Fix {{untrusted event.title}} now"\n'
    )
    err = fails(cfg)
    assert "untrusted_inline" in err.message and err.context["key"] == "[harness.triage] untrusted_inline"

    cfg.write_global(
        '[harness.triage]\nharness = "claude-code"\nmemory_briefing = true\nuntrusted_inline = true\n'
        'prompt_template = "Fix {{untrusted event.title}} now"\n'
    )
    h = cfg.load().harness["triage"]
    assert h.untrusted_inline and h.template_text == "Fix {{untrusted event.title}} now"


@pytest.mark.req20
def test_req20_a_template_file_is_read_and_checked(cfg: Layout) -> None:
    (cfg.root / "etc" / "t.md").write_text("Issue: {{ untrusted event.body }}\n")
    cfg.write_global('[harness.t]\nharness = "x"\nprompt_template_file = "t.md"\n')
    err = fails(cfg)
    assert "untrusted_inline" in err.message and "prompt_template_file" in err.message

    (cfg.root / "etc" / "t.md").write_text("Repo {{repo}}\n")
    assert cfg.load().harness["t"].template_text == "Repo {{repo}}\n"

    cfg.write_global('[harness.t]\nharness = "x"\nprompt_template_file = "missing.md"\n')
    err = fails(cfg)
    assert "[harness.t] prompt_template_file" in err.message and "missing.md" in err.message


@pytest.mark.req20
def test_req20_a_literal_prompt_is_not_a_template(cfg: Layout) -> None:
    cfg.write_global('[harness.t]\nharness = "x"\nprompt = "{{untrusted event.title}}"\n')
    assert cfg.load().harness["t"].prompt == "{{untrusted event.title}}"


# ------------------------------------------------------------------------------------------- holder


def test_config_holder_requires_a_good_first_load(cfg: Layout) -> None:
    cfg.write_global("[memory]\nprovider = 1\n")
    with pytest.raises(ConfigError):
        ConfigHolder(cfg.load)
