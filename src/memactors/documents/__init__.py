"""The documents memactors serves to agents: recall answers and briefings, from rows to rendered text.

One pipeline, pure code, no I/O. The briefing actor and the built-in provider gather rows and the
provider's items; this package turns them into a document and the document into what the gateway sends:

* ``_items``: an item for each kind of row (fact, run, episode, collision), the briefing's layout
  (REQ-14), near-duplicates collapsed, the cached form read back, the derived nonce;
* ``_gist``: an episode's gist, the few hundred characters an agent sees of it;
* ``_model``: the document's parts (provenance, item, section, document) and its nonce;
* ``_render``: the text form and the JSON form (MCP structured content);
* ``_fit``: a recall answer fitted to REQ-12's cap, a briefing to REQ-14's, and the one word-boundary
  cut.

The format (the "memory data wrapper") is described for agent and provider authors in
``docs/wrapper.md``. This module is the public face: import from ``memactors.documents``, never from
its private modules.
"""

from __future__ import annotations

from ._fit import BRIEFING_MAX_BYTES as BRIEFING_MAX_BYTES
from ._fit import ELLIPSIS as ELLIPSIS
from ._fit import RECALL_MAX_BYTES as RECALL_MAX_BYTES
from ._fit import WIRE_ENVELOPE_BYTES as WIRE_ENVELOPE_BYTES
from ._fit import cut_at_word as cut_at_word
from ._fit import fit_briefing as fit_briefing
from ._fit import fit_recall as fit_recall
from ._gist import gist as gist
from ._gist import lead as lead
from ._gist import matches as matches
from ._items import BRIEFING_CANDIDATES as BRIEFING_CANDIDATES
from ._items import BRIEFING_EPISODES as BRIEFING_EPISODES
from ._items import BRIEFING_LAYOUT as BRIEFING_LAYOUT
from ._items import FACT_POOL as FACT_POOL
from ._items import NEAR_DUPLICATE as NEAR_DUPLICATE
from ._items import PROVIDER_UNAVAILABLE as PROVIDER_UNAVAILABLE
from ._items import RECALL_POINTER as RECALL_POINTER
from ._items import RECENT_RUNS as RECENT_RUNS
from ._items import RECENT_RUNS_POOL as RECENT_RUNS_POOL
from ._items import CollisionLike as CollisionLike
from ._items import FactLike as FactLike
from ._items import KeptLike as KeptLike
from ._items import RunLike as RunLike
from ._items import age as age
from ._items import briefing_episode_item as briefing_episode_item
from ._items import briefing_run_item as briefing_run_item
from ._items import collapse_episodes as collapse_episodes
from ._items import collapse_facts as collapse_facts
from ._items import collision_item as collision_item
from ._items import counts as counts
from ._items import derived_nonce as derived_nonce
from ._items import document_from_json as document_from_json
from ._items import episode_item as episode_item
from ._items import fact_ids as fact_ids
from ._items import fact_item as fact_item
from ._items import is_empty_run as is_empty_run
from ._items import is_trivial_run as is_trivial_run
from ._items import run_item as run_item
from ._items import withhold_facts as withhold_facts
from ._model import BRIEFING_SECTIONS as BRIEFING_SECTIONS
from ._model import NONCE_BYTES as NONCE_BYTES
from ._model import RECALL_SECTIONS as RECALL_SECTIONS
from ._model import Document as Document
from ._model import Item as Item
from ._model import Provenance as Provenance
from ._model import Section as Section
from ._model import build_document as build_document
from ._model import new_nonce as new_nonce
from ._render import item_chars as item_chars
from ._render import render_json as render_json
from ._render import render_text as render_text
