"""Where Debian's PostgreSQL server programs are, and the one file-staging helper both the test
cluster (`postgres`) and the pgvector build (`pgvector_build`) use; imports neither."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from pathlib import Path


def server_bindir() -> Path:
    """Where `initdb`, `pg_ctl` and `postgres` are. Raises RuntimeError naming what to install."""
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True, timeout=10)
            candidates.append(Path(out.stdout.strip()))
    base = Path("/usr/lib/postgresql")
    if base.is_dir():
        versions = sorted((p for p in base.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True)
        candidates += [v / "bin" for v in versions]
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's `postgresql` "
                       "package (`make test` does it)")


def link_or_copy(src: str, dst: str) -> str:
    """A hard link to `src` when everyone may read it (and run it, if it is a program); else a copy
    that everyone may."""
    mode = os.stat(src).st_mode
    executable = bool(mode & stat.S_IXUSR)
    if mode & stat.S_IROTH and (not executable or mode & stat.S_IXOTH):
        with contextlib.suppress(OSError):
            os.link(src, dst)
            return dst
    shutil.copy2(src, dst)
    os.chmod(dst, 0o755 if executable else 0o644)
    return dst
