"""A document rendered: the text form agents read, and the same content as MCP structured content.

The text form is blocks joined by "\n" with no trailing newline. The budgeting code (`_fit`) measures
the same blocks these helpers build, so what it counts is exactly what `render_text` emits.
"""

from __future__ import annotations

from typing import Any

from ._model import NONCE_BYTES, Document, Item, Section, _check_nonce, _content_strings

#: The opening lines of an item's fence (see _item_block: the closing line carries the nonce).
_OPEN = "<item>"
_OPEN_UNTRUSTED = '<item untrusted="true">'



def _header(kind: str, nonce: str, degraded: str | None, truncated: int) -> str:
    deg = f' degraded="{degraded}"' if degraded else ""
    return f'<memory-data kind="{kind}" nonce="{nonce}"{deg} truncated="{truncated}">'


def _footer(nonce: str) -> str:
    return f'</memory-data nonce="{nonce}">'


def _heading(section: Section) -> str:
    return f"## {section.name}" + (f" ({section.note})" if section.note else "")


def _dropped_line(count: int, pointer: str | None) -> str:
    return f"({count} more not shown; {pointer})" if pointer else f"({count} more not shown)"


def _item_block(item: Item, nonce: str) -> str:
    """An item: its provenance line, then (when it has text) the text fenced.

    The opening line carries no nonce, only the flag: it always follows the item's provenance line,
    which is outside every fence, so no text can put an opening line anywhere a reader would take one.
    The closing line carries the nonce, and that is what text cannot forge: nothing ends a fence but
    ``</item nonce="N">``. Leaving the nonce off the opening line saves 24 characters per item, which
    a briefing spends on the items' own text.
    """
    line = item.provenance.line()
    if not item.text:
        return line
    opening = _OPEN_UNTRUSTED if item.untrusted else _OPEN
    return f'{line}\n{opening}\n{item.text}\n</item nonce="{nonce}">'


def item_chars(item: Item) -> int:
    """Characters `item` takes in a document (its block and the line break after it), with a nonce of
    the length every document's has (``NONCE_BYTES`` as hex): what it costs of a section's share."""
    return len(_item_block(item, "0" * (2 * NONCE_BYTES))) + 1


def _blocks(doc: Document) -> list[str]:
    blocks = [_header(doc.kind, doc.nonce, doc.degraded, doc.truncated)]
    for s in doc.sections:
        blocks.append(_heading(s))
        blocks.extend(_item_block(it, doc.nonce) for it in s.items)
        if s.dropped:
            blocks.append(_dropped_line(s.dropped, doc.pointer))
    blocks.append(_footer(doc.nonce))
    return blocks


def render_text(doc: Document, *, show_degraded: bool = False) -> str:
    """The plain-text document; deterministic for a given document (nonce included).

    An empty briefing renders as ``""`` (REQ-14), unless ``show_degraded`` and it is degraded: then it
    renders its headings and marker as a recall does (a briefing read while the store is down is not
    known to be empty; the gateway tells the agent so, REQ-13). An empty recall still renders its
    headings, so the agent sees the sections and any ``degraded`` marker. Raises InvalidArgument if the
    nonce occurs in the content (a hand-built document with a bad nonce).
    """
    if doc.kind == "briefing" and doc.is_empty and not (show_degraded and doc.degraded):
        return ""
    _check_nonce(doc.nonce, _content_strings(doc.sections, doc.degraded, doc.pointer))
    return "\n".join(_blocks(doc))


def render_json(doc: Document) -> dict[str, Any]:
    """The same content as JSON-ready data (MCP structured content)."""
    return {
        "kind": doc.kind,
        "nonce": doc.nonce,
        "degraded": doc.degraded,
        "truncated": doc.truncated,
        "pointer": doc.pointer,
        "sections": [
            {
                "name": s.name,
                "note": s.note,
                "dropped": s.dropped,
                "items": [
                    {
                        "label": it.provenance.label,
                        "provenance": dict(it.provenance.fields),
                        "text": it.text,
                        "untrusted": it.untrusted,
                    }
                    for it in s.items
                ],
            }
            for s in doc.sections
        ],
    }
