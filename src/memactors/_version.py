"""The package version, in a module of its own so that modules inside the package (the built-in
provider's identity, `memactors --version`) read it without importing `memactors/__init__.py`, which
imports the public API."""

__version__ = "0.1.0"
