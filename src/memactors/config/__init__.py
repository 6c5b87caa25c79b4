"""Configuration: the global ``harness.toml``, its ``harness_d`` drop-ins and project files.

Files are TOML, read with the stdlib ``tomllib`` into frozen attrs models. The global file is found as
``--config``, else ``$HARNESS_CONFIG``, else ``~/.config/harness/harness.toml``; the drop-ins
``harness_d/*.toml`` beside it are merged over it in lexical order (later wins per key, tables merge
deeply). Project files (a ``harness.toml`` at a repository root) are merged last but may only declare
``[harness.*]`` entries with project-allowed keys and project-only ``[mcp.*]`` upstreams: everything that
widens what agents see or where episodes go (SPEC-0030 REQ-1, REQ-2, REQ-16, REQ-20) is global-only.

Every failure is a :class:`~memactors.errors.ConfigError` whose message names the file, the key (written
like ``[memory.episodes] provider_timeout``) and the offending value, because an operator reads it in a
terminal with no other context. Unknown keys fail too, so a typo never passes silently.

The package, one concept per module: ``models`` (the frozen attrs classes and their defaults),
``paths`` (where the files and the state directory are: XDG), ``load`` (reading, merging and validating:
what the tables mean; how files are merged and tables read is ``_toml_tables``) and ``holder``
(`ConfigHolder`: the configuration in force, kept when a reload fails). Everything is imported from
here, ``memactors.config``.
"""

from __future__ import annotations

from .._toml_tables import parse_duration as parse_duration
from .holder import ConfigHolder as ConfigHolder
from .holder import config_fingerprint as config_fingerprint
from .load import GLOBAL_ONLY_HARNESS_KEYS as GLOBAL_ONLY_HARNESS_KEYS
from .load import GLOBAL_ONLY_TABLES as GLOBAL_ONLY_TABLES
from .load import load_config as load_config
from .load import store_url_problem as store_url_problem
from .models import DEFAULT_VERIFY_PATTERNS as DEFAULT_VERIFY_PATTERNS
from .models import RELEVANCE_FLOOR as RELEVANCE_FLOOR
from .models import STORE_URL_ENV as STORE_URL_ENV
from .models import Config as Config
from .models import ConsoleConfig as ConsoleConfig
from .models import EpisodesConfig as EpisodesConfig
from .models import HarnessConfig as HarnessConfig
from .models import ListenConfig as ListenConfig
from .models import McpDefaults as McpDefaults
from .models import McpPolicy as McpPolicy
from .models import McpServerConfig as McpServerConfig
from .models import MemoryConfig as MemoryConfig
from .models import ModelApiConfig as ModelApiConfig
from .models import Origin as Origin
from .models import StoreConfig as StoreConfig
from .models import TelemetryConfig as TelemetryConfig
from .paths import default_config_path as default_config_path
from .paths import default_state_path as default_state_path

__all__ = [
    "Config",
    "ConsoleConfig",
    "ConfigHolder",
    "EpisodesConfig",
    "HarnessConfig",
    "ListenConfig",
    "McpDefaults",
    "McpPolicy",
    "McpServerConfig",
    "MemoryConfig",
    "ModelApiConfig",
    "StoreConfig",
    "TelemetryConfig",
    "default_config_path",
    "default_state_path",
    "load_config",
    "parse_duration",
]
