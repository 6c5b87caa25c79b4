"""The suite's own layout: what tests share lives in fixture plugins (tests/fix_*.py) and support modules,
never in another test module (a test module's helpers are importable only when pytest happened to collect
its folder first), and the daemon as a process is one `Daemon` class (tests/fix_daemon.py)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "data" not in p.relative_to(TESTS).parts)


def test_no_test_module_imports_another() -> None:
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.relative_to(TESTS)}:{node.lineno} imports {name}"
                      for name in names if name.split(".")[0].startswith("test_")]
    assert found == [], "move what they share into a tests/fix_*.py or tests/support*.py module:\n" + "\n".join(found)


def test_the_daemon_as_a_process_is_one_class_and_every_fixture_plugin_is_registered() -> None:
    daemons = [f"{path.relative_to(TESTS)}:{node.lineno}" for path in _modules()
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.ClassDef) and node.name == "Daemon"]
    assert len(daemons) == 1 and daemons[0].startswith("fix_daemon.py:"), daemons
    conftest = ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8"))
    plugins = next(ast.literal_eval(node.value) for node in conftest.body if isinstance(node, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets))
    assert sorted(plugins) == sorted(p.stem for p in TESTS.glob("fix_*.py"))
