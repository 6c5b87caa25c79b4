"""The shared redactor as it was at a git revision: its ``redact.py`` and rule file (``git show``),
loaded as a module of this checkout's package, so a bench can run it beside today's on the same input."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def baseline_redactor(rev: str) -> Any:
    """The Redactor of commit ``rev``, with that commit's rule file."""
    def show(path: str) -> bytes:
        return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True,
                              capture_output=True).stdout

    code, rules = show("src/memactors/redact.py"), show("src/memactors/data/redaction_rules.toml")
    with tempfile.NamedTemporaryFile("wb", suffix=".py", delete=False) as file:
        file.write(code)
    try:
        spec = importlib.util.spec_from_file_location("memactors._redact_baseline", file.name)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        module.__package__ = "memactors"
        spec.loader.exec_module(module)
    finally:
        os.unlink(file.name)
    return module.Redactor(rules=module.load_rules(rules))
