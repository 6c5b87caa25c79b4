"""The supervised actors of memactors, one module each (see docs/architecture.md)."""
