"""`memactors service install|uninstall|status --user` as a user runs it (the CLI as a subprocess): the systemd
user unit it writes passes `systemd-analyze verify` and its ExecStart really serves; the launchd agent
parses as a plist with the same command; where the user's service manager cannot be reached the file is
still written and the command says so, naming what enables it.

The user manager is made unreachable on purpose (no runtime directory, no session bus), so no test ever
enables a service on the machine that runs the suite.
"""

from __future__ import annotations

import json
import os
import plistlib
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import write_config


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HARNESS_CONFIG", "XDG_CONFIG_HOME", "XDG_STATE_HOME")}
    nowhere = tmp_path / "no-runtime-dir"
    return {**env, "HOME": str(tmp_path / "home"), "XDG_RUNTIME_DIR": str(nowhere),
            "DBUS_SESSION_BUS_ADDRESS": f"unix:path={nowhere}/bus", **extra}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", "service", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def _unit(tmp_path: Path) -> Path:
    return tmp_path / "home" / ".config" / "systemd" / "user" / "memactors.service"


def _exec_start(unit: str) -> list[str]:
    line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def _environment(unit: str) -> dict[str, str]:
    pairs = [shlex.split(line.removeprefix("Environment="))[0] for line in unit.splitlines()
             if line.startswith("Environment=")]
    return dict(pair.split("=", 1) for pair in pairs)


def test_dry_run_prints_the_unit_and_the_commands_and_writes_nothing(tmp_path: Path) -> None:
    done = _cli(_env(tmp_path), "install", "--user", "--platform", "systemd", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "Restart=on-failure" in done.stdout and "WantedBy=default.target" in done.stdout
    assert _exec_start(done.stdout)[-1] == "serve"
    assert "would run: systemctl --user enable --now memactors.service" in done.stdout
    assert not (tmp_path / "home").exists()


def test_without_a_user_manager_install_writes_the_unit_says_so_and_names_the_enabling_command(tmp_path: Path) -> None:
    done = _cli(_env(tmp_path), "install", "--user", "--platform", "systemd")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"wrote {_unit(tmp_path)}" in done.stdout
    assert "written but not enabled" in done.stderr and "systemctl --user enable --now memactors.service" in done.stderr
    assert _unit(tmp_path).is_file()
    status = _cli(_env(tmp_path), "status", "--platform", "systemd", "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["installed"] and report["path"] == str(_unit(tmp_path)) and report["command"].endswith(" serve")
    removed = _cli(_env(tmp_path), "uninstall", "--user", "--platform", "systemd")
    assert not _unit(tmp_path).exists() and f"removed {_unit(tmp_path)}" in removed.stdout
    assert "could not stop it through the service manager" in removed.stderr  # said, not hidden
    assert _cli(_env(tmp_path), "status", "--platform", "systemd").returncode == 1  # not installed


def test_the_unit_passes_systemd_analyze_verify_and_its_exec_start_serves_the_users_config(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: `make test-tools` installs Debian's systemd package")
    config = write_config(tmp_path)
    state_home = tmp_path / "state-home"
    env = _env(tmp_path, HARNESS_CONFIG=str(config), XDG_STATE_HOME=str(state_home))
    done = _cli(env, "install", "--user", "--platform", "systemd", "--no-enable")
    assert done.returncode == 0, done.stderr
    assert "not enabled (--no-enable)" in done.stdout
    unit = _unit(tmp_path).read_text(encoding="utf-8")
    verified = subprocess.run([analyze, "verify", str(_unit(tmp_path))], capture_output=True, text=True,
                              timeout=120, check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "memactors.service" not in verified.stderr, verified.stderr  # no warning about our unit
    assert _environment(unit) == {"HARNESS_CONFIG": str(config), "XDG_STATE_HOME": str(state_home),
                                  "PATH": env["PATH"]}  # where the daemon finds the agents' CLIs

    # What the service manager would start, started the way it would: the unit's command and environment only.
    argv = _exec_start(unit)
    assert Path(argv[0]).is_file() and argv[-1] == "serve"
    child_env = {"HOME": str(tmp_path / "home"), **_environment(unit)}
    daemon_json = tmp_path / "state" / "daemon.json"
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=child_env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300  # a hang guard on a loaded machine, not a timed assertion
        while not daemon_json.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon_json.is_file(), log.read_text(errors="replace")
        assert json.loads(daemon_json.read_text(encoding="utf-8"))["pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0  # a clean stop: Restart=on-failure leaves it stopped


def test_a_named_config_that_does_not_exist_is_refused_by_name(tmp_path: Path) -> None:
    done = _cli(_env(tmp_path), "install", "--user", "--platform", "systemd", "--config", str(tmp_path / "nope.toml"))
    assert done.returncode == 5 and f"--config {tmp_path / 'nope.toml'}: configuration file not found" in done.stderr
    assert not _unit(tmp_path).exists()


def test_the_launchd_agent_is_a_plist_that_runs_serve_with_the_config_at_login_and_after_a_failure(
        tmp_path: Path) -> None:
    config = write_config(tmp_path)
    env = _env(tmp_path, XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    done = _cli(env, "install", "--user", "--platform", "launchd", "--no-enable", "--config", str(config))
    assert done.returncode == 0, done.stderr
    path = tmp_path / "home" / "Library" / "LaunchAgents" / "org.memactors.serve.plist"
    agent = plistlib.loads(path.read_bytes())
    assert agent["Label"] == "org.memactors.serve"
    assert agent["ProgramArguments"][1:] == ["serve", "--config", str(config)]
    assert Path(agent["ProgramArguments"][0]).is_file()
    assert agent["RunAtLoad"] is True and agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["EnvironmentVariables"] == {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "PATH": env["PATH"]}
    assert Path(agent["StandardErrorPath"]).parent.is_dir()
    assert "launchctl bootstrap gui/" in done.stdout
    status = _cli(env, "status", "--platform", "launchd", "--json")
    assert json.loads(status.stdout)["command"].endswith(f"serve --config {config}")
    removed = _cli(env, "uninstall", "--platform", "launchd")
    assert f"removed {path}" in removed.stdout and not path.exists()
