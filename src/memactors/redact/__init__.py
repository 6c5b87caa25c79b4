"""The shared redactor: every string of an episode passes here before it is stored, summarised or sent.

SPEC-0030 REQ-6 requires one redactor, with control characters stripped. The patterns are
data, not code: ``memactors/data/redaction_rules.toml``, derived from gitleaks' MIT-licensed default rule
set (see ``memactors/data/README.md``). They are compiled once, on first use, into the module-level
:data:`default` instance that :func:`redact` and :func:`redact_obj` use.

Three properties the rest of the daemon relies on:

* Only the secret part is replaced by the literal ``[REDACTED]``; the words around it stay, so an
  episode keeps its meaning ("pushed with token [REDACTED]").
* Idempotence: ``redact(redact(x)) == redact(x)``. ``[REDACTED]`` matches no rule, and because a
  replacement can in principle open a word boundary that was not there before (``ghp_…AKIA…``), the
  rules are re-applied until nothing changes. Each extra round runs only when the previous one replaced
  something, and each replacement removes characters that are not part of a marker, so the loop ends;
  ordinary text costs exactly one round.
* Linear time: the hand-written patterns start at a literal or a rare character and use possessive
  quantifiers (a failed candidate run is consumed, via a ``reject`` group, rather than rescanned); the
  gitleaks-derived ones are bounded repetitions (their lazy prefixes dropped, ``.*`` bounded when they
  were translated), and each rule makes one ``re.sub`` pass over the text per round.
  tests/redact/test_redact.py times adversarial inputs.
* Keywords first, as gitleaks does: a rule runs only on text holding one of its keywords, so ordinary
  text costs a handful of patterns, not ~230.

One concept per module: ``_control`` (control characters and escape sequences), ``_rules`` (the rule
file compiled, and what one rule finds), ``_anchor`` (where a rule's matches can begin: the one module
on CPython's private ``re._parser``), ``_detectors`` (structural detectors a rule may name),
``_redactor`` (the :class:`Redactor`), ``_shared`` (the process's one compiled rule set, and why it is
one) and ``_lines`` (texts that arrive a line at a time, or cut). This module is the public face:
import from ``memactors.redact``, never from its private modules.
"""

from __future__ import annotations

from typing import Any

from ._anchor import anchor_leads as anchor_leads
from ._control import strip_control as strip_control
from ._lines import LineRedactor as LineRedactor
from ._lines import redact_tail as redact_tail
from ._redactor import STATS as STATS
from ._redactor import Redactor as Redactor
from ._rules import REDACTED as REDACTED
from ._rules import RedactionRule as RedactionRule
from ._rules import RulesError as RulesError
from ._rules import load_rules as load_rules
from ._rules import shannon_entropy as shannon_entropy
from ._shared import _SHARED as _SHARED  # bench/redact_ingest.py puts a baseline redactor here to time it
from ._shared import _shared
from ._shared import redact as redact
from ._shared import redact_config_error as redact_config_error
from ._shared import redact_many as redact_many
from ._shared import redact_obj as redact_obj
from ._shared import rule_ids as rule_ids
from ._shared import shared as shared

__all__ = [
    "REDACTED",
    "STATS",
    "LineRedactor",
    "RedactionRule",
    "Redactor",
    "RulesError",
    "default",  # noqa: F822 - provided lazily by the module __getattr__
    "load_rules",
    "redact",
    "redact_many",
    "redact_obj",
    "redact_tail",
    "rule_ids",
    "shared",
    "shannon_entropy",
    "strip_control",
]


def __getattr__(name: str) -> Any:
    # ``default`` is compiled on first use, not at import: the rule set is a few hundred patterns and a
    # CLI command that never redacts should not pay for them.
    if name == "default":
        return _shared()
    raise AttributeError(name)

