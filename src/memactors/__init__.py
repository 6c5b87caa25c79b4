"""memactors: episodic memory and briefings for fleets of coding agents (SPEC-0030)."""

from .errors import MemactorsError as MemactorsError

__version__ = "0.1.0"
