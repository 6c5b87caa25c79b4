"""Secrets echoed outside records: a secret-like config value (``api_key``, ``token``,
``password``, ``secret``, … in ``[mcp.*]`` or any other table) is never printed or logged: not by
`memactors serve` (its start lines, its log, a config error), not by `doctor` or `memory status`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fix_daemon import start_daemon
from support import write_config

SECRETS = {
    "api_key": "zk-live-4f1b9c2e7a6d5f3b8e0c1a2d",
    "token": "tok-9e8d7c6b5a4f3e2d1c0b9a8f",
    "password": "pw-hunter2-really-long-1234",
    "client_secret": "cs-0a1b2c3d4e5f6a7b8c9d0e1f",
}


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False, stdin=subprocess.DEVNULL)


def _assert_no_secret(text: str) -> None:
    for name, secret in SECRETS.items():
        assert secret not in text, f"{name}'s value shown: {text[-3000:]}"
        assert secret[:12] not in text, f"part of {name}'s value shown"


@pytest.mark.parametrize(("table", "key"), [("mcp.zep", "api_key"), ("gateway", "token"),
                                          ("mcp.zep", "password"), ("memory", "client_secret")])
def test_a_pasted_secret_in_a_config_table_is_masked_in_the_config_error(tmp_path: Path, table: str, key: str) -> None:
    config = write_config(tmp_path, '[mcp.zep]\nurl = "http://127.0.0.1:9/mcp"\n[memory]\n' if table != "gateway"
                          else "")
    text = config.read_text(encoding="utf-8")
    text = text.replace(f"[{table}]\n", f'[{table}]\n{key} = "{SECRETS[key]}"\n')
    assert SECRETS[key] in text
    config.write_text(text, encoding="utf-8")
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(tmp_path)}
    served = _run(env, "serve")
    assert served.returncode == 5, served.stderr[-2000:]
    assert key in served.stderr and "[REDACTED]" in served.stderr, served.stderr[-2000:]  # named, not shown
    _assert_no_secret(served.stdout + served.stderr)
    doctor = _run(env, "doctor")  # it reads the config too, and warns naming its error
    _assert_no_secret(doctor.stdout + doctor.stderr)


@pytest.mark.slow
def test_secrets_in_a_valid_config_are_in_no_start_line_log_line_doctor_or_status(tmp_path: Path) -> None:
    """Secrets where they belong ([mcp.*] env and headers of an upstream that is configured but not the
    provider): serve's start lines, its log, doctor and status show none of them."""
    extra = (
        '[mcp.zep]\nurl = "http://127.0.0.1:9/mcp"\n'
        f'headers = {{Authorization = "Bearer {SECRETS["token"]}", X-Api-Key = "{SECRETS["api_key"]}"}}\n'
        '[mcp.other]\ncommand = "true"\n'
        f'env = {{OTHER_PASSWORD = "{SECRETS["password"]}", OTHER_CLIENT_SECRET = "{SECRETS["client_secret"]}"}}\n'
    )
    daemon = start_daemon(tmp_path, extra_config=extra)
    try:
        env = {**daemon.env, "MEMACTORS_LOG_LEVEL": "DEBUG"}
        for args in (("doctor",), ("memory", "status"), ("memory", "status", "--json"), ("doctor", "--json")):
            done = _run(env, *args)
            _assert_no_secret(done.stdout + done.stderr)
    finally:
        daemon.stop()
    _assert_no_secret(daemon.log_text())
