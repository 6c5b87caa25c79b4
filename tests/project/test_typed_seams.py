"""The typed seams of docs/architecture.md hold, and the type checker that holds them would catch a breach.

`make lint` runs mypy under `strict` over the package (`[tool.mypy]`; the kernel, the gateway, rpc/,
service/ and store/ among it). Here: a copy of the package with two breaches planted fails the check, naming
both: an answer used as the wrong type (`ask` of an `Ask[R]` message is an `R`, not `Any`), and a
`MemoryService` without a member the gateway's `GatewayService` Protocol needs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "memactors"
MYPY = Path(sys.executable).with_name("mypy")


def _plant(path: Path, anchor: str, replacement: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(anchor) == 1, f"{anchor!r} not once in {path.name}: move the plant with the code"
    path.write_text(text.replace(anchor, replacement), encoding="utf-8")


def test_planted_type_breaches_at_the_seams_fail_the_check_and_are_named(tmp_path: Path) -> None:
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(SRC, tmp_path / "src" / "memactors", ignore=shutil.ignore_patterns("__pycache__"))
    service = tmp_path / "src" / "memactors" / "service"
    # 1. A recall's answer taken for an int: only a typed `ask` can tell (an `Any` answer would pass).
    _plant(service / "read_tier.py", "        answer = await self.briefing.address.ask(RecallRequest(",
           "        planted: int = await self.briefing.address.ask(RecallRequest(view=view, query=query))\n"
           "        answer = await self.briefing.address.ask(RecallRequest(")
    # 2. The service loses a member the gateway uses.
    _plant(service / "agent_calls.py", "    async def caller_view(self, token: str | None) -> View:",
           "    async def caller_view_renamed(self, token: str | None) -> View:")
    done = subprocess.run([str(MYPY), "--cache-dir", str(tmp_path / ".mypy_cache")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert 'incompatible type "RecallRequest"; expected "Ask[int]"' in out, out
    gateway = [line for line in out.splitlines() if line.startswith("src/memactors/gateway.py")]
    assert any('got "MemoryService", expected "GatewayService"' in line for line in gateway), out
    assert any("caller_view" in line for line in gateway), out
