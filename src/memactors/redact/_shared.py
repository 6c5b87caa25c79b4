"""The process's one compiled rule set, and the module-level functions that use it.

Why a singleton stays: the rule set is a few hundred patterns and an Aho-Corasick automaton, costly to
compile and identical for every caller, and the callers are everywhere a string crosses a boundary
(episode assembly, the store's cleaning, URLs and ``ConfigError`` masking their values, the RPC's error
ids, run watching). Most of them are plain functions with no service to hand a redactor to; some
(``errors.ConfigError``) run before any service exists. So one redactor per process, compiled on first
use (not at import: a CLI command that never redacts should not pay for it), is what :func:`redact`,
:func:`redact_many`, :func:`redact_obj` and :func:`shared` use. Code that wants other rules builds its
own :class:`~memactors.redact.Redactor`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ._redactor import Redactor
from ._rules import RedactionRule

_SHARED: list[Redactor] = []
#: True while the shared rules compile: a ConfigError raised by a broken rule is then not redacted
#: (there is no redactor yet to do it, and asking for one would compile the rules again).
_COMPILING = False


def _shared() -> Redactor:
    global _COMPILING
    if not _SHARED:
        _COMPILING = True
        try:
            _SHARED.append(Redactor())
        finally:
            _COMPILING = False
    return _SHARED[0]


def redact_config_error(message: str, context: dict[str, object]) -> tuple[str, dict[str, object]]:
    """A ConfigError's message and context values, redacted (as they are while the rules compile)."""
    if _COMPILING:
        return message, context
    return redact(message), {k: redact_obj(v) if isinstance(v, str | list | tuple | dict) else v
                             for k, v in context.items()}


def shared() -> Redactor:
    """The daemon's shared redactor, compiling the rules on the first call (call it off the event loop)."""
    return _shared()


def redact(text: str) -> str:
    """Redact ``text`` with the shared rule set (see :class:`Redactor`)."""
    return _shared().redact(text)


def redact_many(texts: Sequence[str]) -> list[str]:
    """`redact` of each string, with one keyword pass for them all (see :meth:`Redactor.redact_many`)."""
    return _shared().redact_many(texts)


def redact_obj(value: Any) -> Any:
    """Redact every string inside a nested dict/list/tuple with the shared rule set."""
    return _shared().redact_obj(value)


def rule_ids(rules: Iterable[RedactionRule] | None = None) -> list[str]:
    """The ids of the given (default: shared) rules, in the order they are applied."""
    return [rule.id for rule in (_shared().rules if rules is None else rules)]


