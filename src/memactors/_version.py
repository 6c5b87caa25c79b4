"""The package version, in a module of its own so that modules inside the package (the built-in
provider's identity, `memactors --version`) read it without importing `memactors/__init__.py`, which
imports the public API.

setuptools-scm derives the version from git when the package is built or installed and writes it into
`data/VERSION` (pyproject.toml's [tool.setuptools_scm]), read here without importlib.metadata's scan
of site-packages (the CLI starts in tens of milliseconds); the installed metadata is the fallback.
"""

from pathlib import Path


def _read() -> str:
    try:
        return (Path(__file__).parent / "data" / "VERSION").read_text(encoding="utf-8").strip()
    except OSError:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("memactors")
        except PackageNotFoundError:
            return "0+unknown"


__version__ = _read()
