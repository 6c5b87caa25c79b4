"""`memactors service install|uninstall|status --user`: the daemon as a service of the user's session, so
it is up whenever a resident agent's session starts (a session that starts while it is down gets no
briefing).

Linux: a systemd user unit, `$XDG_CONFIG_HOME/systemd/user/memactors.service`, enabled and started with
`systemctl --user enable --now`. macOS: a launchd agent, `~/Library/LaunchAgents/org.memactors.serve.plist`,
loaded with `launchctl bootstrap gui/<uid>`. Both run `memactors serve` from this installation (the
venv's own `memactors`, so a pipx or uv upgrade keeps the path) with the configuration this command
resolves (`--config`, `$HARNESS_CONFIG`, the XDG directories), and restart it when it exits with a
failure (status 75, "the memory service gave up", asks for exactly that; docs/operations.md).

Where the service manager cannot be reached (no user manager in a container, a CI job, an ssh session
without lingering), `install` still writes the file, says so, names the command that enables it, and
exits 1; `--no-enable` only writes it. `--dry-run` prints what would be written and run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from . import _core as core
from ._core import EXIT_FAILED, EXIT_OK

UNIT = "memactors.service"
LABEL = "org.memactors.serve"
#: The environment that decides which configuration and state the daemon finds, carried into the
#: service when set here, so the service serves what `memactors` in this shell talks to; and PATH, where
#: the daemon finds the agent CLIs its harnesses run (`memactors run`: npm's and ~/.local/bin are not on
#: a service manager's own PATH).
CARRIED_ENV = ("HARNESS_CONFIG", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "PATH")
#: Seconds between a failed daemon's exit and its restart.
RESTART_SEC = 5


def default_platform() -> str:
    return "launchd" if sys.platform == "darwin" else "systemd"


def serve_argv(config: str | None) -> list[str]:
    """`memactors serve` of this installation: the console script beside this interpreter (not resolved
    through symlinks, so it stays inside the venv), else `python -m memactors.cli`."""
    script = Path(sys.executable).parent / "memactors"
    argv = [str(script)] if script.is_file() else [sys.executable, "-m", "memactors.cli"]
    argv.append("serve")
    if config:
        argv += ["--config", config]
    return argv


def _home(env: dict[str, str]) -> Path:
    return Path(env.get("HOME") or Path.home())


def unit_path(env: dict[str, str]) -> Path:
    config_home = env.get("XDG_CONFIG_HOME", "")
    base = Path(config_home) if config_home and Path(config_home).is_absolute() else _home(env) / ".config"
    return base / "systemd" / "user" / UNIT


def plist_path(env: dict[str, str]) -> Path:
    return _home(env) / "Library" / "LaunchAgents" / f"{LABEL}.plist"


def _quote(word: str) -> str:
    """A word of a systemd command line: quoted when it has spaces or quotes; `%` and `$` escaped
    (systemd expands specifiers and variables in ExecStart)."""
    escaped = word.replace("%", "%%").replace("$", "$$")
    if escaped and not any(c in escaped for c in " \t\"'\\"):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_text(argv: list[str], carried: dict[str, str]) -> str:
    environment = "".join(f"Environment={_quote(f'{k}={v}')}\n" for k, v in sorted(carried.items()))
    return (
        "# Written by `memactors service install --user`; `memactors service uninstall --user` removes it.\n"
        "[Unit]\n"
        "Description=memactors: memory and briefings for coding agents\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={' '.join(_quote(w) for w in argv)}\n"
        # the daemon reloads harness.toml on SIGHUP (`systemctl --user reload memactors`)
        "ExecReload=/bin/kill -HUP $MAINPID\n"
        f"{environment}"
        # 75: the memory service gave up (an actor crash loop, or out of a resource for 30 minutes)
        "Restart=on-failure\n"
        f"RestartSec={RESTART_SEC}\n"
        "TimeoutStopSec=30\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def plist_bytes(argv: list[str], carried: dict[str, str], log_dir: Path) -> bytes:
    import plistlib

    agent: dict[str, Any] = {
        "Label": LABEL,
        "ProgramArguments": argv,
        "RunAtLoad": True,  # at login
        "KeepAlive": {"SuccessfulExit": False},  # restarted when it exits with a failure
        "ThrottleInterval": RESTART_SEC,
        "ProcessType": "Background",
        "StandardOutPath": str(log_dir / "serve.log"),
        "StandardErrorPath": str(log_dir / "serve.log"),
    }
    if carried:
        agent["EnvironmentVariables"] = dict(sorted(carried.items()))
    return plistlib.dumps(agent, sort_keys=False)


def _resolve_config(args: argparse.Namespace, env: dict[str, str]) -> str | None:
    """The configuration file to name on the service's command line: `--config` made absolute (it must
    exist: a service that cannot start is no service), else none (the daemon resolves
    `$HARNESS_CONFIG` and the XDG default itself, from the carried environment)."""
    named = getattr(args, "config", None)
    if not named:
        return None
    path = Path(named).expanduser().absolute()
    if not path.is_file():
        raise core.CliError("INVALID_ARGUMENT", f"--config {named}: configuration file not found")
    return str(path)


def _carried(env: dict[str, str]) -> dict[str, str]:
    out = {k: env[k] for k in CARRIED_ENV if env.get(k)}
    if "HARNESS_CONFIG" in out:
        named = Path(out["HARNESS_CONFIG"]).expanduser().absolute()
        if not named.is_file():
            raise core.CliError("INVALID_ARGUMENT", f"$HARNESS_CONFIG {out['HARNESS_CONFIG']}: configuration file not found")
        out["HARNESS_CONFIG"] = str(named)
    return out


def _run(argv: list[str]) -> tuple[bool, str]:
    """Run a service manager command: whether it succeeded, and its output (or why it could not run)."""
    import subprocess

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return False, f"{argv[0]} is not installed"
    except subprocess.TimeoutExpired:
        return False, f"{shlex.join(argv)} did not answer in 60 s"
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def _manager_commands(platform: str, path: Path, action: str) -> list[list[str]]:
    uid = str(os.getuid())
    if platform == "systemd":
        return {"install": [["systemctl", "--user", "daemon-reload"],
                            ["systemctl", "--user", "enable", "--now", UNIT]],
                "uninstall": [["systemctl", "--user", "disable", "--now", UNIT]],
                "reload": [["systemctl", "--user", "daemon-reload"]]}[action]
    return {"install": [["launchctl", "bootstrap", f"gui/{uid}", str(path)]],
            "uninstall": [["launchctl", "bootout", f"gui/{uid}/{LABEL}"]],
            "reload": []}[action]


def _run_all(commands: list[list[str]]) -> tuple[bool, str]:
    for argv in commands:
        ok, output = _run(argv)
        if not ok:
            return False, f"`{shlex.join(argv)}` failed: {output or 'no output'}"
    return True, ""


def _what(args: argparse.Namespace) -> tuple[str, Path, bytes]:
    env = dict(os.environ)
    argv = serve_argv(_resolve_config(args, env))
    carried = _carried(env)
    if args.platform == "systemd":
        return args.platform, unit_path(env), unit_text(argv, carried).encode()
    log_dir = _home(env) / "Library" / "Logs" / "memactors"
    return args.platform, plist_path(env), plist_bytes(argv, carried, log_dir)


def _enable_hint(platform: str, path: Path) -> str:
    if platform == "systemd":
        return (f"systemctl --user daemon-reload && systemctl --user enable --now {UNIT} (in a login session; "
                "`loginctl enable-linger $USER` starts it at boot without one)")
    return f"launchctl bootstrap gui/$(id -u) {path}"


def cmd_install(args: argparse.Namespace) -> int:
    platform, path, content = _what(args)
    commands = [] if args.no_enable else _manager_commands(platform, path, "install")
    if args.dry_run:
        print(f"would write {path}:\n")
        print(content.decode(), end="" if content.endswith(b"\n") else "\n")
        for argv in commands:
            print(f"\nwould run: {shlex.join(argv)}", end="")
        print()
        return EXIT_OK
    path.parent.mkdir(parents=True, exist_ok=True)
    if platform == "launchd":
        (_home(dict(os.environ)) / "Library" / "Logs" / "memactors").mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(content)
    partial.replace(path)
    print(f"wrote {path}")
    if args.no_enable:
        print(f"not enabled (--no-enable): {_enable_hint(platform, path)}")
        return EXIT_OK
    ok, why = _run_all(commands)
    if not ok:
        print(f"memactors: the service file is written but not enabled: {why}\n"
              f"  enable it with: {_enable_hint(platform, path)}", file=sys.stderr)
        return EXIT_FAILED
    print("enabled and started: it starts at login and restarts when it fails; "
          "`memactors service status` shows it")
    return EXIT_OK


def cmd_uninstall(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    platform = args.platform
    path = unit_path(env) if platform == "systemd" else plist_path(env)
    commands = _manager_commands(platform, path, "uninstall")
    if args.dry_run:
        for argv in commands:
            print(f"would run: {shlex.join(argv)}")
        print(f"would remove {path}" if path.exists() else f"{path} is not there: nothing to remove")
        return EXIT_OK
    if not path.exists():
        print(f"{path} is not there: no memactors service is installed for this user")
        return EXIT_OK
    ok, why = _run_all(commands)
    path.unlink()
    print(f"removed {path}")
    if platform == "systemd":
        _run_all(_manager_commands(platform, path, "reload"))
    if not ok:
        print(f"memactors: could not stop it through the service manager: {why}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    platform = args.platform
    path = unit_path(env) if platform == "systemd" else plist_path(env)
    out: dict[str, Any] = {"platform": platform, "path": str(path), "installed": path.is_file()}
    if platform == "systemd":
        for key, verb in (("enabled", "is-enabled"), ("active", "is-active")):
            ok, output = _run(["systemctl", "--user", verb, UNIT])
            out[key] = output.splitlines()[-1] if output else ("yes" if ok else "unknown")
    else:
        ok, output = _run(["launchctl", "print", f"gui/{os.getuid()}/{LABEL}"])
        out["loaded"] = ok
        out["manager"] = output.splitlines()[0] if output else ""
    if out["installed"]:
        text = path.read_bytes()
        if platform == "systemd":
            out["command"] = next((line.split("=", 1)[1] for line in text.decode().splitlines()
                                   if line.startswith("ExecStart=")), "")
        else:
            import plistlib

            out["command"] = shlex.join(plistlib.loads(text).get("ProgramArguments", []))
    if args.json:
        core.print_json(out)
    else:
        print(f"{platform} {'installed' if out['installed'] else 'not installed'}: {path}")
        if out.get("command"):
            print(f"runs       {out['command']}")
        for key in ("enabled", "active", "loaded", "manager"):
            if key in out and out[key] not in ("", None):
                print(f"{key:<10} {out[key]}")
    return EXIT_OK if out["installed"] else EXIT_FAILED


def register(sub: Any) -> None:
    service = sub.add_parser(
        "service", help="run the daemon as a service of your user (systemd on Linux, launchd on macOS)",
        description="Install, remove or show the daemon as a service of your user: a systemd user unit on Linux, "
                    "a launchd agent on macOS. It runs `memactors serve` from this installation at login and "
                    "restarts it when it fails.").add_subparsers(dest="service_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--user", action="store_true", default=True,
                       help="a service of your user (the default and the only kind; a system-wide unit is "
                            "described in docs/operations.md)")
        p.add_argument("--platform", choices=("systemd", "launchd"), default=default_platform(),
                       help="the service manager (default: launchd on macOS, systemd elsewhere)")

    p = service.add_parser("install", help="write and enable the service (systemctl --user / launchctl)")
    common(p)
    p.add_argument("--dry-run", action="store_true", help="print what would be written and run; change nothing")
    p.add_argument("--no-enable", action="store_true", help="write the file only; do not call the service manager")
    p.set_defaults(fn=cmd_install)
    p = service.add_parser("uninstall", help="stop, disable and remove the service")
    common(p)
    p.add_argument("--dry-run", action="store_true", help="print what would be run and removed; change nothing")
    p.set_defaults(fn=cmd_uninstall)
    p = service.add_parser("status", help="whether the service is installed, enabled and running (exit 1 if not installed)")
    common(p)
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(fn=cmd_status)
