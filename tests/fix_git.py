"""Plugin: git as a test of repository keys needs it (`isolated_git`): no repository above the test's
directory, no user or system configuration, and the repository cache empty."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memactors.repo import clear_cache


@pytest.fixture
def isolated_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No repository above tmp_path counts, and no user or system git config leaks in."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("HOME", str(tmp_path))
    clear_cache()
