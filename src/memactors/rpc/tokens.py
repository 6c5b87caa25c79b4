"""The operator bearer tokens: one per tier (``read``, ``control``), in ``operator-<tier>.token`` (mode
0600) in the state directory, made once by the daemon and read by the CLI and TUI; a presented token is
compared with both in constant time."""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

import attrs

from ..errors import ConfigError
from .frames import TIERS, Tier


@attrs.frozen(repr=False)
class Tokens:
    """The two operator bearer tokens; ``repr`` hides them so a log line cannot leak one."""

    read: str
    control: str

    def __repr__(self) -> str:
        return "Tokens(read=<hidden>, control=<hidden>)"

    def tier_for(self, presented: bytes | str | None) -> Tier | None:
        """Return the tier a presented token grants, or None for no or an unknown token.

        Both tokens are always compared, in constant time, so timing tells nothing about which
        one (if any) nearly matched.
        """
        if presented is None:
            return None
        given = presented.encode("utf-8", "surrogateescape") if isinstance(presented, str) else presented
        if not given:
            return None
        is_read = hmac.compare_digest(given, self.read.encode())
        is_control = hmac.compare_digest(given, self.control.encode())
        if is_control:
            return "control"
        if is_read:
            return "read"
        return None


def _token_path(state_dir: Path, tier: Tier) -> Path:
    if tier not in TIERS:
        raise ValueError(f"unknown operator tier {tier!r}")
    return Path(state_dir) / f"operator-{tier}.token"


def _read_token_file(path: Path) -> str:
    token = path.read_text(encoding="utf-8").strip()
    if not token:
        raise ConfigError("operator token file is empty", file=str(path))
    return token


def ensure_tokens(state_dir: Path) -> Tokens:
    """Create the operator token files if missing and return both tokens.

    An existing file is never rewritten (a running CLI or TUI keeps working), only its mode is
    tightened to 0600. New tokens are ``secrets.token_urlsafe(32)``, created with O_EXCL so two
    daemons starting at once cannot overwrite each other. Blocking file I/O: from async code call it
    through ``trio.to_thread.run_sync``.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, str] = {}
    for tier in TIERS:
        path = _token_path(state_dir, tier)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if stat.S_IMODE(path.stat().st_mode) != 0o600:
                os.chmod(path, 0o600)
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
            # umask cannot widen 0o600, but make the mode explicit anyway.
            os.chmod(path, 0o600)
        found[tier] = _read_token_file(path)
    if found["read"] == found["control"]:
        raise ConfigError("operator read and control tokens are identical", state_dir=str(state_dir))
    return Tokens(read=found["read"], control=found["control"])


def read_token(state_dir: Path, tier: Tier) -> str:
    """Return the token of ``tier`` from the state directory (for the CLI and TUI).

    Raises ``ConfigError`` naming the file when it is missing or empty.
    """
    path = _token_path(Path(state_dir), tier)
    try:
        return _read_token_file(path)
    except FileNotFoundError:
        raise ConfigError(
            "no operator token file; has the daemon started with this state directory?", file=str(path)
        ) from None
