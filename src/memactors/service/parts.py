"""What every handler of MemoryService works with (the mixins of this package share it as their base).

The configuration holder, the store, the metrics, the supervisor and the actors `open_memory_service` starts
under it, the wall clock, the built-in provider and what this daemon saw of each resident install. The
embeddings' status is here too: the read tier's Status and the control tier's Reindex both answer with it.
"""

from __future__ import annotations

from typing import Any

from ..actors.assembler import Assembler
from ..actors.briefing import Briefing
from ..actors.call_log import CallLog
from ..actors.index import Index
from ..actors.kernel import Supervisor
from ..actors.provider_session import ProviderSession
from ..actors.retention import Retention
from ..actors.runs import Runs
from ..actors.summary import SummaryActor
from ..builtin import BuiltinProvider
from ..config import Config, ConfigHolder
from ..embedding import BUILTIN_MODEL, model_info
from ..errors import StoreUnavailable
from ..metrics import Metrics
from ..store import Store, WallClock
from .installs import InstallActivity


class ServiceParts:
    """The service's parts; `wiring.open_memory_service` sets the actors once each has started."""

    def __init__(self, *, holder: ConfigHolder, store: Store, metrics: Metrics, supervisor: Supervisor,
                 wall_clock: WallClock) -> None:
        self.holder = holder
        self.store = store
        self.metrics = metrics
        self.supervisor = supervisor
        self.wall_clock = wall_clock
        self.provider = holder.current.memory.provider
        self.session: ProviderSession
        self.call_log: CallLog
        self.index: Index
        self.assembler: Assembler
        self.retention: Retention
        self.summary: SummaryActor
        self.briefing: Briefing
        self.runs: Runs
        #: The gateway's URL once the daemon serves it (``gateway.start_gateway``; runs get it in their
        #: MCP config), else None.
        self.gateway_url: str | None = None
        self.builtin: BuiltinProvider = BuiltinProvider(store)
        #: What this daemon saw of each resident install (gateway requests, briefings), to tell a silent one.
        self.installs = InstallActivity(started=wall_clock())

    @property
    def config(self) -> Config:
        return self.holder.current

    async def embeddings_status(self) -> dict[str, Any] | None:
        """The built-in provider's embeddings (REQ-11): which model, where it runs, how many episodes
        have a vector and how many wait for one; the embedded model's memory once loaded. None when
        embeddings are off (``[memory] embeddings = false``) or episodes go to another provider."""
        builtin = self.builtin
        if not self.config.memory.is_builtin or not builtin.hybrid:
            model_api = self.config.model_api
            if (self.config.memory.is_builtin and self.config.memory.embeddings
                    and (model_api is None or not model_api.embedding_model)):
                return {"model": BUILTIN_MODEL, "source": "embedded", "runtime": model_info(), "episodes": 0,
                        "with_vector": 0, "pending": 0, "off": "the embedded model is not installed"}
            return None
        try:
            out = await builtin.vector_status()
        except StoreUnavailable:
            return None
        model_api = self.config.model_api
        if model_api is None or not model_api.embedding_model:
            out["source"] = "embedded"
            out["runtime"] = model_info()
        else:
            out["source"] = "model_api"
        return out
