"""URLs are shown without their credentials: ``mask_url`` itself, and every surface that prints
or logs an upstream's URL — config errors, ``memactors doctor``, ``memory status`` (text and JSON),
``memory provider check``, the daemon's log (a failed reload, the provider's stderr) — with the daemon as a
process and the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from loguru import logger

from fix_daemon import start_daemon
from memactors.provider_stderr import log_stderr
from memactors.urls import MASK, mask_url, mask_urls
from support import write_config

PASS, KEY, TOK, HASH, REFRESH = "Pa55w0rdXyz", "QueryKey9Abc", "FragTok7Qrs", "HashVal3Def", "Refresh5Ghi"
SECRET_URL = (f"http://svc:{PASS}@127.0.0.1:9/mcp?api_key={KEY}&x=1&hash={HASH}&refresh={REFRESH}"
              f"#access_token={TOK}")
SHOWN_URL = f"http://svc:{MASK}@127.0.0.1:9/mcp?api_key={MASK}&x=1&hash={MASK}&refresh={MASK}#access_token={MASK}"


@pytest.mark.parametrize(("url", "shown"), [
    (SECRET_URL, SHOWN_URL),
    # the user name is who connects, not a secret; only the password goes
    ("postgresql://memactors:PW@host/db", f"postgresql://memactors:{MASK}@host/db"),
    ("postgresql://memactors@db.internal/ledger", "postgresql://memactors@db.internal/ledger"),
    ("postgresql://a8Fk2LmQ9xZ3vB7nR4tY6wE1@db/x", f"postgresql://{MASK}@db/x"),  # a token, by its looks
    ("https://p.example/mcp?hash=9f8e7d&refresh=r1t2&page=2", f"https://p.example/mcp?hash={MASK}&refresh={MASK}&page=2"),
    ("https://ghs_TOKEN123@forge.example/acme/api.git", f"https://{MASK}@forge.example/acme/api.git"),
    ("postgres://app:p@ss@db.internal:5432/ledger", f"postgres://app:{MASK}@db.internal:5432/ledger"),
    ("https://acme.blob.core.windows.net/c/db.bak?sv=2022-11-02&sp=r&sig=abc%2Bdef%3D",
     f"https://acme.blob.core.windows.net/c/db.bak?sv=2022-11-02&sp=r&sig={MASK}"),
    ("https://s3.example/b/k?X-Amz-Credential=AKIA/x&X-Amz-Signature=ab12&X-Amz-Expires=60",
     f"https://s3.example/b/k?X-Amz-Credential={MASK}&X-Amz-Signature={MASK}&X-Amz-Expires=60"),
    ("http://h/mcp?token=a&password=b&secret=c&key=d&pwd=e&auth=f&code=g&page=2",
     f"http://h/mcp?token={MASK}&password={MASK}&secret={MASK}&key={MASK}&pwd={MASK}&auth={MASK}&code={MASK}&page=2"),
    ("https://actions.zapier.com/mcp/sk-ak-Xk9mP2vL8qR4nT7wZ3yB5cD1/sse", f"https://actions.zapier.com/mcp/{MASK}/sse"),
    ("https://api.telegram.org/bot1234567890:AAHk9mP2vL8qR4nT7wZ3yB5cD1eF6gH7iJ8/getMe",
     f"https://api.telegram.org/bot{MASK}/getMe"),
    # what an operator needs to recognise the URL stays
    ("https://zep.example.net/mcp", "https://zep.example.net/mcp"),
    ("http://[::1]:8080/mcp?x=1", "http://[::1]:8080/mcp?x=1"),
    ("/usr/local/bin/mem0-mcp", "/usr/local/bin/mem0-mcp"),
])
def test_mask_url_hides_userinfo_credential_parameters_and_token_segments(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    assert mask_url(shown) == shown  # idempotent


def test_mask_urls_finds_urls_in_a_message_and_keeps_its_punctuation() -> None:
    message = f"cannot connect to {SECRET_URL}: refused (see https://docs.example/x)."
    assert mask_urls(message) == f"cannot connect to {SHOWN_URL}: refused (see https://docs.example/x)."


_URL_SAFE = st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789-._~", min_size=8, max_size=40)


@given(password=_URL_SAFE, key=_URL_SAFE, name=st.sampled_from(["api_key", "token", "sig", "password", "secret",
                                                                  "access_token", "apiKey", "X-Api-Key"]))
def test_no_password_or_credential_parameter_survives_mask_url(password: str, key: str, name: str) -> None:
    shown = mask_url(f"https://user:{password}@host.example:8443/mcp?a=1&{name}={key}")
    assert password not in shown and key not in shown
    assert shown.startswith("https://user:") and "@host.example:8443/mcp?a=1&" in shown


async def test_a_provider_stderr_line_shows_urls_without_credentials() -> None:
    read_fd, write_fd = os.pipe()
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m.record["extra"].get("line"))), level="INFO",
                      filter=lambda r: r["message"] == "provider stderr")
    try:
        os.write(write_fd, f"connecting to {SECRET_URL}\n".encode())
        os.close(write_fd)
        with trio.fail_after(10):
            await log_stderr(read_fd, logger)
    finally:
        logger.remove(sink)
    # The line is redacted first (a credential that is a URL's whole userinfo is seen whole), then its
    # URLs masked: no secret survives; the user name may go with the password in a log.
    assert len(lines) == 1 and lines[0].startswith("connecting to ")
    _assert_masked(lines[0])
    assert "127.0.0.1:9/mcp" in lines[0]


def _cli(config: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HARNESS_CONFIG": str(config), "HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], capture_output=True, text=True,
                          timeout=120, check=False, env=env)


def _assert_masked(text: str) -> None:
    for secret in (PASS, KEY, TOK, HASH, REFRESH):
        assert secret not in text, text


@pytest.mark.slow
async def test_doctor_status_provider_check_config_errors_and_the_log_show_the_url_masked(tmp_path: Path) -> None:
    upstream = f'[memory]\nprovider = "zep"\n[mcp.zep]\nurl = "{SECRET_URL}"\n'
    daemon = await trio.to_thread.run_sync(lambda: start_daemon(tmp_path, extra_config=upstream))
    config = tmp_path / "harness.toml"
    try:
        with trio.fail_after(60):
            while True:  # the upstream (a closed port) is found down at the first connection attempt
                status = await trio.to_thread.run_sync(lambda: _cli(config, tmp_path, "memory", "status", "--json"))
                if json.loads(status.stdout)["state"] == "down":
                    break
                await trio.sleep(0.2)
        outputs = [status.stdout + status.stderr]
        for args in (("memory", "status"), ("doctor",), ("memory", "provider", "check", "--provider", "zep")):
            done = await trio.to_thread.run_sync(lambda args=args: _cli(config, tmp_path, *args))
            outputs.append(done.stdout + done.stderr)
        for output in outputs:
            _assert_masked(output)
        assert f"http://svc:{MASK}@127.0.0.1:9/mcp?api_key={MASK}" in outputs[1]  # the last error names it
        # A reload with an unknown key whose value is a URL fails; the daemon logs the error, masked.
        config.write_text(config.read_text() + f'colour = "{SECRET_URL}"\n', encoding="utf-8")
        daemon.proc.send_signal(signal.SIGHUP)
        with trio.fail_after(30):
            while "configuration reload failed" not in daemon.log_text():  # noqa: ASYNC110 -- the log is a file
                await trio.sleep(0.1)
        # The CLI reading the same file reports the same error, masked, naming the key.
        errored = await trio.to_thread.run_sync(lambda: _cli(config, tmp_path, "memory", "status"))
        assert "[mcp.zep] colour" in errored.stderr
        _assert_masked(errored.stdout + errored.stderr)
        (tmp_path / "other").mkdir()
        bad_scheme = write_config(tmp_path / "other", f'[mcp.zep]\nurl = "ftp{SECRET_URL[4:]}"\n')
        refused = await trio.to_thread.run_sync(lambda: _cli(bad_scheme, tmp_path, "doctor"))
        assert "[mcp.zep] url" in refused.stderr and "must be an http" in refused.stderr
        _assert_masked(refused.stdout + refused.stderr)
    finally:
        await trio.to_thread.run_sync(daemon.stop)
    log = daemon.log_text()
    assert "configuration reload failed" in log and f"svc:{MASK}@" in log
    _assert_masked(log)
