"""Reading TOML configuration files: merged in order, each key's file remembered, typed reads that name
the file, the key and the value of what is wrong.

config.py says what memactors' configuration means (its tables, keys, defaults and rules); this is the
machinery under it, which knows nothing of memactors: :class:`Sources` merges the files (later wins per
key, tables merge deeply) and remembers which file set each key; :class:`Table` reads one table's
keys as typed values, marks each as read, and fails on the first one nobody read (a typo never
passes silently); :func:`parse_duration` reads ``"90d"``-style durations. Every error is a
:class:`~memactors.errors.ConfigError` whose value is shown with its URLs masked (:func:`show`).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from .errors import ConfigError
from .urls import mask_values

__all__ = ["EMPTY", "MAX_DURATION", "Sources", "Table", "frozen_map", "is_duration", "key_name", "parse_duration", "read_toml", "show",
           "table_name"]

EMPTY: Mapping[str, Any] = MappingProxyType({})


def frozen_map(data: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """A read-only view of a fresh copy, so a frozen model cannot be changed through its mappings."""
    return MappingProxyType(dict(data or {}))


def show(value: object) -> str:
    """A value as the operator would write it in TOML (strings double-quoted), every URL in it masked
    (``mask_url``: an upstream's URL may carry a password, a key or a token)."""
    value = mask_values(value)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")

#: A key whose value is a secret (compared lower-cased, anywhere in the name): its text is never shown in
#: an error, a log line or any output (a pasted ``[mcp.zep] api_key`` was once printed whole). A key
#: ending ``_env`` names an environment variable, not its value, and is shown.
SECRET_KEY = re.compile(r"key|token|secret|passw|pwd|^pw$|credential|auth|bearer|cookie|private|signature")
SECRET_MASK = "[REDACTED]"


def is_secret_key(name: object) -> bool:
    text = str(name).lower()
    return bool(SECRET_KEY.search(text)) and not text.endswith("_env")


def mask_secrets(value: Any, key: object = None) -> Any:
    """``value`` with every string under a secret-like key (``key`` itself, or any nested table's key)
    replaced by ``[REDACTED]``; numbers and booleans are left as they are (they are no secret)."""
    if isinstance(value, str):
        return SECRET_MASK if key is not None and is_secret_key(key) else value
    if isinstance(value, dict):
        return {k: mask_secrets(v, k if is_secret_key(k) else key) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(mask_secrets(v, key) for v in value)
    return value


def table_name(parts: Sequence[str]) -> str:
    """``("mcp", "a.b")`` → ``[mcp."a.b"]``, quoting parts TOML would need quoted."""
    return "[" + ".".join(p if _BARE_KEY.fullmatch(p) else json.dumps(p) for p in parts) + "]"


def key_name(table: Sequence[str], key: str | None) -> str:
    """``[memory.episodes] provider_timeout``; a top-level key is written bare."""
    if key is None:
        return table_name(table)
    bare = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
    return f"{table_name(table)} {bare}" if table else bare


@attrs.define
class Sources:
    """Merged data plus, for every key path, the file that last set it (for error messages)."""

    data: dict[str, Any] = attrs.Factory(dict)
    provenance: dict[tuple[str, ...], Path] = attrs.Factory(dict)
    fallback: Path = Path("harness.toml")

    def merge(self, doc: Mapping[str, Any], file: Path) -> None:
        _merge_into(self.data, doc, file, (), self.provenance)

    def file_of(self, path: Sequence[str]) -> Path:
        """The file that set ``path``, or the nearest enclosing table's file."""
        p = tuple(path)
        while p:
            if p in self.provenance:
                return self.provenance[p]
            p = p[:-1]
        return self.fallback


def _merge_into(
    dst: dict[str, Any],
    src: Mapping[str, Any],
    file: Path,
    path: tuple[str, ...],
    provenance: dict[tuple[str, ...], Path],
) -> None:
    for key, value in src.items():
        here = (*path, key)
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge_into(dst[key], value, file, here, provenance)
        else:
            dst[key] = _deep_copy(value)
            # A replaced table's old children no longer exist; forget where they came from.
            for stale in [p for p in provenance if p[: len(here)] == here and len(p) > len(here)]:
                del provenance[stale]
            _record(value, file, here, provenance)


def _record(value: Any, file: Path, path: tuple[str, ...], provenance: dict[tuple[str, ...], Path]) -> None:
    provenance[path] = file
    if isinstance(value, dict):
        for key, child in value.items():
            _record(child, file, (*path, key), provenance)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", file=str(path)) from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}", file=str(path)) from exc


class Table:
    """Typed, consumed-key-tracking access to one table, raising ConfigError that names file/key/value."""

    def __init__(self, sources: Sources, path: Sequence[str], data: Mapping[str, Any] | None) -> None:
        self.sources = sources
        self.path = tuple(path)
        self.data: Mapping[str, Any] = data if data is not None else {}
        self.used: set[str] = set()

    # -- errors
    def error(self, key: str | None, value: object, reason: str, *, show_value: bool = True) -> ConfigError:
        file = self.sources.file_of((*self.path, key) if key is not None else self.path)
        name = key_name(self.path, key)
        value = mask_secrets(value, key)
        shown = show(value) if show_value else f"<{type(value).__name__}>"
        where = f"{name} = {shown}" if key is not None else name
        return ConfigError(
            f"{file}: {where}: {reason}", file=str(file), key=name, value=value if show_value else shown
        )

    # -- typed reads
    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> Any:
        self.used.add(key)
        return self.data[key]

    def str_(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        if key not in self.data:
            if required:
                raise self.error(key, None, "is required")
            return default
        value = self.raw(key)
        if not isinstance(value, str):
            raise self.error(key, value, "must be a string")
        return value

    def bool_(self, key: str, default: bool) -> bool:
        if key not in self.data:
            return default
        value = self.raw(key)
        if not isinstance(value, bool):
            raise self.error(key, value, "must be true or false")
        return value

    def fraction(self, key: str, default: float) -> float:
        """A number from 0 to 1 (an integer 0 or 1 too)."""
        if key not in self.data:
            return default
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise self.error(key, value, "must be a number from 0 to 1")
        return float(value)

    def int_(self, key: str, default: int, lo: int, hi: int | None = None) -> int:
        if key not in self.data:
            return default
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, value, "must be an integer")
        if value < lo or (hi is not None and value > hi):
            span = f"{lo} to {hi}" if hi is not None else f"at least {lo}"
            raise self.error(key, value, f"must be {span}")
        return value

    def str_list(self, key: str) -> tuple[str, ...]:
        if key not in self.data:
            return ()
        value = self.raw(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, value, "must be a list of strings")
        return tuple(value)

    def str_map(self, key: str) -> Mapping[str, str]:
        """A table of strings. Values may be secrets (headers, env), so errors show types, not values."""
        if key not in self.data:
            return EMPTY
        value = self.raw(key)
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self.error(key, value, "must be a table of strings", show_value=False)
        return frozen_map(value)

    def duration(self, key: str, default: str) -> tuple[float, str]:
        text = self.str_(key, None)
        if text is None:
            return parse_duration(default), default
        try:
            seconds = parse_duration(text)
        except ConfigError as exc:
            raise self.error(key, text, exc.message.split(": ", 1)[-1]) from None
        if seconds <= 0:
            raise self.error(key, text, "must be greater than zero")
        return seconds, text

    def sub(self, key: str) -> Table:
        """A sub-table; absent is an empty table, anything but a table is an error."""
        value = self.data.get(key)
        if key in self.data:
            self.used.add(key)
            if not isinstance(value, dict):
                raise self.error(key, value, "must be a table")
        return Table(self.sources, (*self.path, key), value)

    def finish(self) -> None:
        """Fail on the first key nobody read: a typo must not pass silently."""
        for key in self.data:
            if key not in self.used:
                raise self.error(key, self.data[key], "unknown key")


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: The longest duration any input takes (a retention, a TTL, `--since`): far past any use, and well
#: inside what a date can go back or forward by (999999999d was an OverflowError: INTERNAL, a 500).
MAX_DURATION = "36500d (100 years)"
MAX_DURATION_SECONDS = 36500 * 86400.0


def is_duration(text: object) -> bool:
    """Whether `text` is written as a duration (a number and a unit), whatever its size."""
    return isinstance(text, str) and _DURATION.fullmatch(text) is not None


def parse_duration(text: str) -> float:
    """Parse ``"90d"``, ``"2s"``, ``"500ms"``, ``"1.5s"`` (units ms, s, m, h, d) into float seconds.

    Raises ConfigError (with only ``value`` set; the loader adds file and key) for anything else,
    including negatives, bare numbers and the empty string.
    """
    if not isinstance(text, str):
        raise ConfigError(f'{show(text)} is not a duration (a string like "90d")', value=text)
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ConfigError(
            f'{show(text)} is not a duration: write a number and one of ms, s, m, h, d, like "2s"',
            value=text,
        )
    seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if not math.isfinite(seconds):
        raise ConfigError(f"{show(text)} is not a finite duration", value=text)
    if seconds > MAX_DURATION_SECONDS:
        raise ConfigError(f"{show(text)} is longer than the longest duration, {MAX_DURATION}", value=text)
    return seconds
