"""What `make run` puts in a user's venv, and the upper bounds where memactors uses a package's
internals (docs/dependencies.md).

`make` runs as a subprocess (a dry run with its own venv path, so nothing is installed); the bounds are
read from pyproject.toml and checked against what is installed: the next release that may change
those internals fails here before it fails in a user's daemon.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]

#: Packages whose internals memactors drives, and where: each needs an upper bound below its next major
#: (for 0.x, the next minor: what semantic versioning lets break).
INTERNALS = {
    "hypercorn": "memactors.net.listen runs its trio worker's Lifespan, TCPServer and WorkerContext",
    "mcp": "memactors.telemetry wraps mcp.shared._otel and mcp.server._otel",
}


def dry_run(target: str, tmp_path: Path) -> str:
    if shutil.which("make") is None:
        pytest.fail("make is missing: the README's `make run` needs it")
    done = subprocess.run(["make", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_run_installs_the_runtime_dependencies_only(tmp_path: Path) -> None:
    commands = dry_run("run", tmp_path)
    installs = [line for line in commands.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    # the project without its test extra; its dependency memactors-model (the embedded model's files) from
    # the wheel scripts/build_model_wheel.py builds first
    python = f"{tmp_path / 'venv'}/bin/python"
    assert installs == [f"{python} -m pip install --quiet --find-links .cache/wheels -e '.'"], commands
    assert f"{python} scripts/build_model_wheel.py --out .cache/wheels" in commands.splitlines()
    assert "--no-deps" not in commands  # nothing installed past its declared dependencies: `pip check` passes
    assert "[test]" not in commands
    assert "[test]" not in commands and "memactors serve" in commands


def test_make_test_installs_the_test_extra(tmp_path: Path) -> None:
    for target in ("test-fast", "lint"):
        assert "pip install --quiet --find-links .cache/wheels -e '.[test]'" in dry_run(target, tmp_path)


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {Requirement(r).name.lower(): Requirement(r) for r in project["dependencies"]}


def _next_major(version: Version) -> Version:
    return Version(f"0.{version.minor + 1}") if version.major == 0 else Version(f"{version.major + 1}")


@pytest.mark.parametrize("name", sorted(INTERNALS))
def test_a_package_whose_internals_we_use_is_bounded_below_its_next_major(name: str) -> None:
    requirement = _requirements()[name]
    installed = Version(importlib.metadata.version(name))
    assert any(spec.operator in ("<", "<=", "~=", "==") for spec in requirement.specifier), (
        f"{requirement}: no upper bound, though {INTERNALS[name]}")
    assert requirement.specifier.contains(installed), (
        f"{name} {installed} is installed, outside {requirement}: check {INTERNALS[name]}, then move the bound")
    assert not requirement.specifier.contains(_next_major(installed)), (
        f"{requirement} admits {name} {_next_major(installed)}, whose internals may differ ({INTERNALS[name]})")


def test_every_other_dependency_has_a_lower_bound_and_no_needless_upper_one() -> None:
    for name, requirement in _requirements().items():
        assert any(spec.operator == ">=" for spec in requirement.specifier), requirement
        if name not in INTERNALS:
            assert not any(spec.operator in ("<", "<=") for spec in requirement.specifier), (
                f"{requirement}: an upper bound without an internal API to protect (add it to INTERNALS)")
