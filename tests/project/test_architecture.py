"""The layers of docs/architecture.md hold, and the check that holds them would catch a breach.

`make lint` runs `lint-imports` over pyproject.toml's `[tool.importlinter]` contracts (layers,
independence, no cycles, private modules). Here: the real tree keeps them; a copy of the package with
one upward import planted (the store importing the service: a layer broken and a cycle made) fails,
naming that import; and no module imports a private name (`_x`) from another package, which the
contracts do not see. SQL lives in store/ (and the built-in provider's storage). And the page itself says
what the code does: its package tree names every module in the layer the contract places it, its
supervision tree is the children the service starts, in order, and every message its actor table names
is sent somewhere; each check is shown to name a planted breach.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "memactors"
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(project: Path, src: Path) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH comes before the editable install's path: this copy is the one linted. Wide columns keep
    # each contract's name and verdict on one line.
    env = {**os.environ, "PYTHONPATH": str(src), "COLUMNS": "250"}
    return subprocess.run([str(LINT), "--no-logo", "--no-cache", str(project / "pyproject.toml")], cwd=project,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_import_contracts_hold_on_the_tree() -> None:
    done = _lint(REPO, REPO / "src")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_planted_upward_import_fails_the_check_and_names_it(tmp_path: Path) -> None:
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(SRC, tmp_path / "src" / "memactors", ignore=shutil.ignore_patterns("__pycache__"))
    planted = tmp_path / "src" / "memactors" / "store" / "engines.py"
    text = planted.read_text(encoding="utf-8")
    anchor = "from . import Store, is_store_url\n"
    assert anchor in text
    planted.write_text(text.replace(anchor, anchor + "from ..service import MemoryService  # noqa: F401\n"),
                       encoding="utf-8")
    done = _lint(tmp_path, tmp_path / "src")
    assert done.returncode != 0, done.stdout
    assert "memactors.store.engines -> memactors.service" in done.stdout, done.stdout
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN")]
    assert any("Arrows only downward" in line for line in broken), done.stdout
    assert any("No import cycles" in line for line in broken), done.stdout


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_a_private_name_from_another_package() -> None:
    """`from x.y import _name` only inside x.y's own package (dunders such as __version__ are not private)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("memactors"):
                continue
            owner = source.rpartition(".")[0] if (SRC.parent / (source.replace(".", "/") + ".py")).exists() else source
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                is_module = (SRC.parent / (source.replace(".", "/")) / (alias.name + ".py")).exists()
                if private and not is_module and not (package + ".").startswith(owner + "."):
                    found.append(f"{name}: from {source} import {alias.name}")
    assert found == []


#: SQL statements in a string: what `db.execute` runs (a docstring saying SELECT is prose, not SQL).
_SQL = re.compile(
    r"\bSELECT\s+\S|\bINSERT\s+INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b"
    r"|\b(?:CREATE|ALTER|DROP)\s+(?:VIRTUAL\s+)?(?:UNIQUE\s+)?(?:TABLE|INDEX|TRIGGER|EXTENSION)\b|^\s*PRAGMA\s+\w"
    r"|^\s*(?:(?:ROLLBACK\s+TO|RELEASE)\s+)?SAVEPOINT\s+\w"
)
#: Where SQL belongs: the store (one module per concept, per engine where it differs) and the built-in
#: provider's own store.
_SQL_HOMES = ("store", "builtin")
#: Modules that still hold SQL outside those homes, each with why. The list only shrinks: a module that
#: no longer holds SQL must leave it (the test says so), and a new one fails until its SQL is in store/.
SQL_NOT_YET_IN_STORE = {
    "testing/postgres.py": "test support: configures the throwaway PostgreSQL server itself",
}


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every string literal but docstrings; an f-string as its literal parts with `{}` for each field."""
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            docstrings.update(id(v) for v in node.values)  # read as part of the f-string only
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def _modules_with_sql() -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.split("/")[0] in _SQL_HOMES:
            continue
        lines = [n for n, s in _strings(ast.parse(path.read_text(encoding="utf-8"))) if _SQL.search(s)]
        if lines:
            found[rel] = lines
    return found


def test_sql_lives_in_the_store_and_the_list_of_exceptions_only_shrinks() -> None:
    found = _modules_with_sql()
    new = {m: lines for m, lines in found.items() if m not in SQL_NOT_YET_IN_STORE}
    assert new == {}, f"SQL outside store/ (move it into a store module): {new}"
    gone = sorted(set(SQL_NOT_YET_IN_STORE) - set(found))
    assert gone == [], f"no SQL left in {gone}: take them off SQL_NOT_YET_IN_STORE"


def test_the_sql_check_sees_a_statement_planted_outside_the_store() -> None:
    planted = 'def f(db):\n    """SELECT is a word in prose."""\n    return db.execute(f"DELETE FROM facts WHERE id = {1}")\n'
    assert [n for n, s in _strings(ast.parse(planted)) if _SQL.search(s)] == [3]
    assert [s for _, s in _strings(ast.parse('"""UPDATE runs SET x = 1"""\nX = "select a word"\n')) if _SQL.search(s)] == []
    assert [n for n, s in _strings(ast.parse('db.execute("SAVEPOINT w")\ndb.execute("ROLLBACK TO SAVEPOINT w")\n'))
            if _SQL.search(s)] == [1, 2]


# -- docs/architecture.md says what the code does ---------------------------------------------------------

DOCS = REPO / "docs" / "architecture.md"


def _section_block(doc: str, heading: str) -> str:
    """The first fenced block after `heading` in docs/architecture.md."""
    return doc.split(heading + "\n", 1)[1].split("```", 2)[1]


def _tree_rows(doc: str) -> list[str]:
    """The rows of "The tree" (after its header and rule), each with its continuation lines."""
    rows: list[str] = []
    for line in _section_block(doc, "## The tree").strip("\n").splitlines()[2:]:
        if line[:1].strip():
            rows.append(line)
        elif rows:
            rows[-1] += " " + line.strip()
    return rows


def _layers() -> list[list[str]]:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers"]
    return [[n.strip() for n in re.split(r"[|:]", layer)] for layer in contract["layers"]]


def _layer_gaps(doc: str, layers: list[list[str]]) -> dict[int, list[str]]:
    """{layer index: the modules the layers contract places there that its row of the docs' tree never names}."""
    rows = _tree_rows(doc)
    gaps: dict[int, list[str]] = {}
    for n, names in enumerate(layers):
        row = rows[n] if n < len(rows) else ""
        missing = [m for m in names if not re.search(rf"(?<![\w/.]){re.escape(m)}(?![\w])", row)]
        if missing:
            gaps[n] = missing
    return gaps


def _supervised_in_docs(doc: str) -> list[str]:
    return re.findall(r"[├└]── (\w+)", _section_block(doc, "## Supervision tree"))


def _children_started(source: str) -> list[str]:
    """The names of the `ChildSpec`s the service's wiring starts, in the order of its source."""
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "ChildSpec"
             and node.args and isinstance(node.args[0], ast.Constant)]
    return [str(c.args[0].value) for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


def _messages_in_docs(doc: str) -> set[str]:
    """The message classes the actor table's last column ("messages it answers") names."""
    table = doc.split("## The actors\n", 1)[1].strip().split("\n\n", 1)[0]
    return {name for row in table.splitlines()[2:] for name in re.findall(r"`([A-Z]\w+)", row.rsplit("|", 2)[-2])}


def _constructed() -> set[str]:
    """Every name called anywhere in the package: a message class that is never called is never sent."""
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                if isinstance(node.func, ast.Name):
                    names.add(node.func.id)
                elif isinstance(node.func, ast.Attribute):
                    names.add(node.func.attr)
    return names


def test_the_docs_tree_names_every_module_in_the_layer_the_import_contract_places_it() -> None:
    assert _layer_gaps(DOCS.read_text(encoding="utf-8"), _layers()) == {}


def test_the_docs_supervision_tree_is_the_children_the_service_starts_in_their_order() -> None:
    started = _children_started((SRC / "service" / "wiring.py").read_text(encoding="utf-8"))
    assert "embedder" in started
    assert _supervised_in_docs(DOCS.read_text(encoding="utf-8")) == started


def test_every_message_the_docs_actor_table_names_is_sent_somewhere() -> None:
    named = _messages_in_docs(DOCS.read_text(encoding="utf-8"))
    assert {"RecordRuns", "ProviderCall", "StartRun"} <= named
    assert sorted(named - _constructed()) == []


def test_the_docs_checks_name_a_planted_gap_a_missing_child_and_an_unsent_message() -> None:
    doc = DOCS.read_text(encoding="utf-8")
    layers = _layers()
    assert _layer_gaps(doc, [*layers[:-1], [*layers[-1], "tachyon"]]) == {len(layers) - 1: ["tachyon"]}
    assert _layer_gaps(doc.replace("daemon.py | tui.py", "daemon.py"), layers) == {2: ["tui"]}
    assert _supervised_in_docs(doc.replace("├── index ", "├── indexer ")) != _supervised_in_docs(doc)
    assert _children_started('s.start(ChildSpec("a", f))\ns.start(ChildSpec("b", g))\n') == ["a", "b"]
    planted = doc.replace("`RecordRuns` (a batch of `RecordRun`), ", "`RecordRuns` (a batch of `RecordRun`), `FilterItems`, ")
    assert planted != doc
    assert sorted(_messages_in_docs(planted) - _constructed()) == ["FilterItems"]
