"""XDG base directories: the default global file and state directory honour
XDG_CONFIG_HOME / XDG_STATE_HOME, and fall back to the paths memactors always used."""

from __future__ import annotations

from pathlib import Path

from memactors.config import default_config_path, load_config


def test_config_file_follows_xdg_config_home_then_falls_back(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    assert default_config_path({"HOME": home}) == Path(home) / ".config/harness/harness.toml"
    assert default_config_path({"HOME": home, "XDG_CONFIG_HOME": "/xdg/config"}) == Path("/xdg/config/harness/harness.toml")
    assert default_config_path({"HOME": home, "XDG_CONFIG_HOME": "relative"}) == Path(home) / ".config/harness/harness.toml"
    named = {"HOME": home, "XDG_CONFIG_HOME": "/xdg/config", "HARNESS_CONFIG": "/etc/h.toml"}
    assert default_config_path(named) == Path("/etc/h.toml")


def test_state_directory_follows_xdg_state_home_then_falls_back(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert load_config(env={"HOME": str(home)}).store.path == home / ".local/share/harness"
    xdg = tmp_path / "state-home"
    assert load_config(env={"HOME": str(home), "XDG_STATE_HOME": str(xdg)}).store.path == xdg / "harness"


def test_a_config_in_xdg_config_home_is_the_one_loaded(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    (xdg / "harness").mkdir(parents=True)
    (xdg / "harness" / "harness.toml").write_text('[operator]\nlisten = "127.0.0.1:7999"\n')
    config = load_config(env={"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(xdg)})
    assert config.operator.port == 7999
