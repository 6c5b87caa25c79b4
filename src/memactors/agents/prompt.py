"""The prompt fence around untrusted text (SPEC-0030 REQ-16; REQ-20 says how it changes the prompt source).

A prompt one-shot with ``memory_briefing = true`` gets its briefing prepended as::

    <untrusted-data source="harness-memory" field="briefing" nonce="NONCE">
    BRIEFING
    </untrusted-data nonce="NONCE">

    PROMPT

with a fresh nonce per spawn and the operator's prompt byte for byte. This module builds that block,
decides whether it fits in one argv element, and renders the ``{{untrusted event.<field>}}`` template
references that the same fence carries when ``untrusted_inline`` is set. It never logs: the composed
prompt is never persisted, logged or put on the wire, so the caller logs sizes and counts from the
returned :class:`PromptPlan`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from ..documents import new_nonce
from ..errors import ConfigError, InvalidArgument

__all__ = [
    "ARG_MAX_SINGLE",
    "PromptPlan",
    "fence",
    "fence_briefing",
    "compose_prompt",
    "fits_single_arg",
    "validate_template",
    "render_template",
    "plan_prompt_argv",
]

#: Linux MAX_ARG_STRLEN (32 pages of 4 KiB): the longest single argv string, terminating NUL included.
ARG_MAX_SINGLE = 131072

_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_UNTRUSTED_EVENT = re.compile(r"^untrusted\s+event\.([A-Za-z_][A-Za-z0-9_]*)$")
_PLAIN_EVENT = re.compile(r"^event\.([A-Za-z_][A-Za-z0-9_]*)$")
_ATTR_SAFE = re.compile(r"^[A-Za-z0-9_.:-]+$")

SkipReason = Literal["briefing_unavailable", "argument_limit", "empty"]


def fence(value: str, *, source: str, field: str, nonce: str | None = None) -> str:
    """The untrusted-data fence around ``value`` , with no trailing newline.

    The nonce is fresh (64 random bits) and absent from ``value`` unless one is passed, in which case
    it is checked. Raises InvalidArgument for a passed nonce found in the value or for attribute
    values that could break the opening line.
    """
    for name, attr in (("source", source), ("field", field)):
        if not _ATTR_SAFE.match(attr):
            raise InvalidArgument("fence attribute must be a plain token", field=name, value=attr)
    if nonce is None:
        nonce = new_nonce([value])
    elif not nonce or nonce in value or not _ATTR_SAFE.match(nonce):
        raise InvalidArgument("fence nonce must be a plain token absent from the fenced value", field="nonce")
    return (
        f'<untrusted-data source="{source}" field="{field}" nonce="{nonce}">\n'
        f"{value}\n"
        f'</untrusted-data nonce="{nonce}">'
    )


def fence_briefing(briefing: str, nonce: str | None = None) -> str:
    """REQ-16's block around a rendered briefing, fresh nonce unless one is passed."""
    return fence(briefing, source="harness-memory", field="briefing", nonce=nonce)


def compose_prompt(briefing: str, prompt: str, *, nonce: str | None = None) -> str:
    """The prompt a one-shot receives: ``prompt`` unchanged when the briefing is empty, otherwise
    the fenced briefing, a blank line (``"\\n\\n"`` after the closing fence line), then ``prompt``
    byte for byte."""
    if briefing == "":
        return prompt
    return fence_briefing(briefing, nonce) + "\n\n" + prompt


def fits_single_arg(text: str) -> bool:
    """True when ``text`` fits in one Linux argv element: UTF-8 bytes plus the NUL within
    :data:`ARG_MAX_SINGLE`. Lone surrogates count as three bytes, which only errs on the safe side."""
    return len(text.encode("utf-8", "surrogatepass")) + 1 <= ARG_MAX_SINGLE


def validate_template(template: str, *, untrusted_inline: bool) -> tuple[str, ...]:
    """Check a prompt template's placeholders; returns the event fields it references, in order.

    Only ``{{untrusted event.<field>}}`` is known. It needs ``untrusted_inline = true`` (REQ-20:
    ``memory_briefing`` does not open the event fence), else ConfigError naming ``untrusted_inline``.
    ``{{event.<field>}}`` without ``untrusted`` and any other placeholder are InvalidArgument.
    """
    fields: list[str] = []
    for match in _PLACEHOLDER.finditer(template):
        expr = " ".join(match.group(1).split())
        if m := _UNTRUSTED_EVENT.match(expr):
            if not untrusted_inline:
                raise ConfigError(
                    "template references {{untrusted event."
                    + m.group(1)
                    + "}} but untrusted_inline is not true",
                    key="untrusted_inline",
                )
            fields.append(m.group(1))
        elif m := _PLAIN_EVENT.match(expr):
            raise InvalidArgument(
                "event fields must be referenced as {{untrusted event." + m.group(1) + "}}", placeholder=expr
            )
        else:
            raise InvalidArgument("unknown template placeholder", placeholder=expr)
    return tuple(fields)


def render_template(template: str, *, event: Mapping[str, str] | None, untrusted_inline: bool) -> str:
    """Render a prompt template: each ``{{untrusted event.<field>}}`` becomes an untrusted-data fence
    (``source="event"``, ``field="<field>"``) around the event's value, with one fresh nonce per
    rendering that occurs in none of the fenced values. Everything else is copied unchanged.

    Raises ConfigError naming ``untrusted_inline`` when the fence is not open, and InvalidArgument
    for unknown placeholders, a missing event, or a field the event lacks.
    """
    fields = validate_template(template, untrusted_inline=untrusted_inline)
    if not fields:
        return template
    if event is None:
        raise InvalidArgument("template references event fields but the run has no event", field=fields[0])
    missing = [f for f in fields if f not in event]
    if missing:
        raise InvalidArgument("event lacks a field the template references", field=missing[0])
    nonce = new_nonce(str(event[f]) for f in fields)

    def replace(match: re.Match[str]) -> str:
        name = _UNTRUSTED_EVENT.match(" ".join(match.group(1).split()))
        assert name is not None  # validate_template accepted only these
        return fence(str(event[name.group(1)]), source="event", field=name.group(1), nonce=nonce)

    return _PLACEHOLDER.sub(replace, template)


@attrs.frozen
class PromptPlan:
    """What to spawn: the argv, whether the briefing was prepended, and if not, why.

    ``reason`` is ``briefing_unavailable`` (the briefing could not be computed), ``argument_limit``
    (the composed prompt would not fit in one argument) or ``empty`` (nothing to prepend); ``None``
    when composed. The first two are REQ-16 skips the caller logs at WARN and counts.
    """

    argv: tuple[str, ...]
    composed: bool
    reason: SkipReason | None


def plan_prompt_argv(base_argv: Sequence[str], prompt: str, briefing: str | None) -> PromptPlan:
    """The argv for a prompt one-shot: ``base_argv`` plus one last element, the composed prompt when
    the briefing exists, is non-empty and fits :func:`fits_single_arg`; otherwise the prompt alone."""
    base = tuple(base_argv)
    if briefing is None:
        return PromptPlan(base + (prompt,), False, "briefing_unavailable")
    if briefing == "":
        return PromptPlan(base + (prompt,), False, "empty")
    composed = compose_prompt(briefing, prompt)
    if not fits_single_arg(composed):
        return PromptPlan(base + (prompt,), False, "argument_limit")
    return PromptPlan(base + (composed,), True, None)
