"""The configuration in force and its reload (REQ-1): `ConfigHolder` keeps the last good configuration
when a reload fails; `config_fingerprint` notices an edit to the files without reading them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .models import Config


def config_fingerprint(global_path: Path | None) -> tuple[tuple[str, int, int, int, int], ...]:
    """What the global configuration looks like on disk, to notice an edit: (path, inode,
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
