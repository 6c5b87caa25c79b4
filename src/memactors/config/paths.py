"""Where the configuration and the state directory are: ``--config``, else ``$HARNESS_CONFIG``, else the
XDG configuration directory; the state directory under ``$XDG_STATE_HOME``. ``~`` is expanded against
the environment given, so tests and the daemon's children see the same paths."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    """``$HARNESS_CONFIG`` if set, else ``$XDG_CONFIG_HOME/harness/harness.toml``, else
    ``~/.config/harness/harness.toml`` (``HOME`` from ``env``)."""
    env = os.environ if env is None else env
    named = env.get("HARNESS_CONFIG")
    if named:
        return expand_user(named, env)
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


def expand_user(text: str, env: Mapping[str, str], base: Path | None = None) -> Path:
    """``~`` and ``~/x`` from ``env``'s HOME; a relative path is taken relative to ``base``."""
    if text == "~" or text.startswith("~/"):
        path = _home(env) / text[2:] if text != "~" else _home(env)
    else:
        path = Path(text).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    return path
