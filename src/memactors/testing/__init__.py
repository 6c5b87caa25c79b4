"""Fault-injection helpers shared by the tests and the benchmarks (a provider that hangs, dies, lies).

Above everything in the layers: it may import any of memactors, and no module of the package imports it.

Re-exports are lazy so that ``python -m memactors.testing.fault_provider`` does not import the module
twice (runpy warns when a package import has already loaded the module it is about to run).
"""

from __future__ import annotations

from typing import Any

__all__ = ["FAULT_MODES", "fault_provider_params"]


def __getattr__(name: str) -> Any:
    if name == "fault_provider_params":
        from .fault_provider import fault_provider_params

        return fault_provider_params
    if name == "FAULT_MODES":
        from .fault_provider import MODES

        return MODES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
