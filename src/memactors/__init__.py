"""memactors: episodic memory and briefings for fleets of coding agents (SPEC-0030).

Embed it in a trio daemon:

    from memactors import ConfigHolder, load_config, open_memory_service

    async with open_memory_service(ConfigHolder(load_config)) as memory:
        await memory.ingest_run(run_record)
        answer = await memory.recall(query="flaky ledger", repo="forge.example/acme/api")

The names below are imported on first use (PEP 562), so `import memactors.cli` — and with it every
`memactors` command — does not pay for the service, the MCP SDK and the store it does not need.
"""

from __future__ import annotations

from ._version import __version__ as __version__

# Nothing else is imported here: `memactors serve` catches SIGHUP at the top of `memactors.cli`, and
# every module imported before that widens the start-up window in which a SIGHUP still ends the
# process. `typing` alone costs tens of milliseconds on a loaded machine.
TYPE_CHECKING = False

_EXPORTS = {
    "Config": "config", "ConfigHolder": "config", "load_config": "config",
    "ActorStopped": "errors", "ConfigError": "errors", "DeadlineExceeded": "errors",
    "InvalidArgument": "errors", "MemactorsError": "errors", "NoRepository": "errors",
    "NotAttributed": "errors", "PermissionDenied": "errors", "ProviderIncompatible": "errors",
    "ProviderReserved": "errors", "ProviderUnavailable": "errors", "UnknownEpisode": "errors",
    "StoreUnavailable": "errors",
    "Episode": "models", "RunRecord": "models",
    "MemoryService": "service", "open_memory_service": "service",
    "prepare_spawn": "actors.spawn",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> object:
    import importlib

    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'memactors' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # what a type checker and an editor see
    from .actors.spawn import prepare_spawn as prepare_spawn
    from .config import Config as Config
    from .config import ConfigHolder as ConfigHolder
    from .config import load_config as load_config
    from .errors import ActorStopped as ActorStopped
    from .errors import ConfigError as ConfigError
    from .errors import DeadlineExceeded as DeadlineExceeded
    from .errors import InvalidArgument as InvalidArgument
    from .errors import MemactorsError as MemactorsError
    from .errors import NoRepository as NoRepository
    from .errors import NotAttributed as NotAttributed
    from .errors import PermissionDenied as PermissionDenied
    from .errors import ProviderIncompatible as ProviderIncompatible
    from .errors import ProviderReserved as ProviderReserved
    from .errors import ProviderUnavailable as ProviderUnavailable
    from .errors import StoreUnavailable as StoreUnavailable
    from .errors import UnknownEpisode as UnknownEpisode
    from .models import Episode as Episode
    from .models import RunRecord as RunRecord
    from .service import MemoryService as MemoryService
    from .service import open_memory_service as open_memory_service
