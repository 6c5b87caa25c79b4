"""The web console's parts without a daemon: its configuration key, its sessions' expiry and
the health page's charts over the daemon's own counters."""

from __future__ import annotations

from pathlib import Path

import pytest

from memactors.config import load_config
from memactors.console.charts import Sampler
from memactors.console.sessions import Sessions, same_token
from memactors.errors import ConfigError
from memactors.metrics import Metrics


def _load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "harness.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, env={"HOME": str(tmp_path)})


def test_console_is_off_by_default_on_loopback_7379(tmp_path: Path) -> None:
    config = _load(tmp_path, "")
    assert config.console.enabled is False
    assert config.console.listen.address == "127.0.0.1:7379"
    on = _load(tmp_path, '[console]\nenabled = true\nlisten = "[::1]:0"\n')
    assert on.console.enabled and on.console.listen.host == "::1"


@pytest.mark.parametrize(("text", "key", "words"), [
    ('[console]\nlisten = "0.0.0.0:7379"\n', "[console] listen", "loopback"),
    ('[console]\nlisten = "192.168.1.4:7379"\n', "[console] listen", "loopback"),
    ('[console]\nlisten = "7379"\n', "[console] listen", "host:port"),
    ('[console]\nenabled = "yes"\n', "[console] enabled", ""),
    ('[console]\nport = 7379\n', "[console] port", ""),
])
def test_console_config_errors_name_the_key(tmp_path: Path, text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    assert key in info.value.message and words in info.value.message


def test_console_config_is_global_only(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".harness").mkdir(parents=True)
    project = repo / ".harness" / "harness.toml"
    project.write_text('[console]\nenabled = true\n', encoding="utf-8")
    (tmp_path / "harness.toml").write_text("", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "harness.toml", project_files=[project], env={"HOME": str(tmp_path)})
    assert "console" in info.value.message


def test_console_sessions_expire_idle_and_old_and_are_bounded() -> None:
    now = [0.0]
    sessions = Sessions(clock=lambda: now[0], idle=10, max_age=25, cap=2)
    a = sessions.create("read")
    assert sessions.get(a.sid) is a and sessions.get("nope") is None and sessions.get(None) is None
    now[0] = 9
    assert sessions.get(a.sid) is a  # seen: idle restarts
    now[0] = 18
    assert sessions.get(a.sid) is a
    now[0] = 26
    assert sessions.get(a.sid) is None  # past the absolute age however busy
    b = sessions.create("control")
    now[0] = 37
    assert sessions.get(b.sid) is None  # idle
    first, second, third = sessions.create("read"), sessions.create("read"), sessions.create("read")
    assert sessions.get(first.sid) is None and sessions.get(second.sid) and sessions.get(third.sid)
    assert a.csrf != b.csrf and same_token(a.csrf, a.csrf) and not same_token(b.csrf, a.csrf)
    assert not same_token(None, a.csrf) and not same_token("", a.csrf)


def test_console_charts_draw_the_daemons_counters_per_interval() -> None:
    metrics = Metrics()
    now = [0.0]
    sampler = Sampler(metrics.registry, clock=lambda: now[0])
    sampler.sample()
    for outcome in ("ok", "ok", "degraded"):
        metrics.recall("builtin", outcome)
    metrics.dropped("builtin", "scope", 2)
    metrics.observe_provider_call("builtin", "recall", 0.010)
    metrics.observe_provider_call("builtin", "recall", 0.030)
    now[0] = 10
    sampler.sample()
    metrics.recall("builtin", "ok")
    now[0] = 20
    sampler.sample()
    recalls, latency, dropped = sampler.charts()
    assert dict(recalls.series) == {"degraded": (1.0, 0.0), "ok": (2.0, 1.0)}
    assert recalls.total == {"degraded": 1.0, "ok": 3.0}
    assert dict(dropped.series) == {"scope": (2.0, 0.0)}
    assert dict(latency.series)["recall"] == pytest.approx((20.0, 0.0))
    svg = str(recalls.svg())
    assert svg.startswith("<svg") and svg.count("<polyline") == 2 and "peak 2" in svg
    # An hour's window: samples older than it are let go.
    now[0] = 20 + 3600
    sampler.sample()
    assert [t for t, _ in sampler.points] == [20.0, 3620.0]


def test_values_are_shown_for_people_not_as_python_writes_them() -> None:
    """`free_bytes 72991703040`, `True`, `None` and `memory_briefing` were shown as they are."""
    from datetime import UTC, datetime

    from memactors.humanize import absolute, ago, cost, duration, human, label, mb

    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    assert mb(72991703040) == "73.0 GB" and mb(5_242_880) == "5.2 MB" and mb(None) == "—"
    assert (human(True), human(False), human(None), human([]), human(["a", "b"])) == ("yes", "no", "—", "—", "a, b")
    assert human({"free_bytes": 3, "memory_briefing": False}) == "free space: 3; briefing at session start: no"
    assert label("memory_briefing") == "briefing at session start" and label("state_since") == "state since"
    assert (duration(850), duration(12_340), duration(125_000), duration(7_380_000)) == (
        "850 ms", "12.3 s", "2 min 05 s", "2 h 03 min")
    assert (cost(0.04213), cost(12.5), cost(None)) == ("$0.0421", "$12.50", "—")
    assert ago("2026-12-07T09:00:00Z", now) == "3 h ago" and ago("2026-11-28T12:00:00Z", now) == "9 d ago"
    assert ago("2026-12-07T11:59:50Z", now) == "just now" and ago("not a time", now) == "not a time"
    assert absolute("2026-12-07T09:00:00+01:00") == "2026-12-07 08:00 UTC"
