"""Reading and writing an agent's JSON configuration file the way its user wrote it.

`memactors install` merges its entries into files people keep by hand, so what it reads is the file's
exact text (no newline translation: a CRLF file stays CRLF) and what it writes keeps that file's layout:
its indent (spaces or a tab; a one-line file stays on one line), its line ends (CRLF or LF), whether it
ends with a line break and a leading byte-order mark. Uninstall restores the exact bytes it recorded
(``cli/install.py``); this layout matters for a file changed since, which loses only memactors' entries.

A file with comments or trailing commas (JSONC, which Gemini CLI and OpenCode accept) is refused, naming
it: merging into it would drop what the user wrote there. Nothing is changed then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._core import CliError

__all__ = ["BOM", "dumps_like", "loads_object", "read_exact"]

BOM = "\ufeff"


def read_exact(path: Path) -> str | None:
    """The file's text exactly as stored (UTF-8, no newline translation); None when it does not exist."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CliError("INVALID_ARGUMENT", f"cannot read {path}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CliError("INVALID_ARGUMENT", f"{path} is not UTF-8 text; nothing was changed") from None


def loads_object(path: Path, text: str | None) -> dict[str, Any]:
    """The JSON object ``text`` holds ({} for no file or a blank one); an error naming ``path`` otherwise."""
    body = (text or "").removeprefix(BOM)
    if not body.strip():
        return {}
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise CliError("INVALID_ARGUMENT", f"{path} is not valid JSON ({exc}); install does not merge into a "
                                           "file with comments or trailing commas (it would lose them): fix or "
                                           "move it, then run again (nothing was changed)") from None
    if not isinstance(data, dict):
        raise CliError("INVALID_ARGUMENT", f"{path} does not hold a JSON object; nothing was changed")
    return data


def dumps_like(data: dict[str, Any], like: str | None) -> str:
    """``data`` as JSON in the layout of ``like`` (the file as it was). Default: two spaces, LF, a final
    line break."""
    indent: int | str | None = 2
    end, newline, bom = "\n", "\n", ""
    if like is not None and like.startswith(BOM):
        bom, like = BOM, like.removeprefix(BOM)
    if like is not None and like.strip():
        newline = "\r\n" if "\r\n" in like else "\n"
        end = newline if like.endswith("\n") else ""
        lines = like.strip().splitlines()
        if len(lines) == 1:
            indent = None
        else:
            for line in lines[1:]:
                stripped = line.lstrip(" \t")
                if stripped and stripped != line:
                    lead = line[: len(line) - len(stripped)]
                    indent = lead if "\t" in lead else len(lead)
                    break
    separators = (", ", ": ") if indent is None else (",", ": ")
    text = json.dumps(data, indent=indent, ensure_ascii=False, separators=separators)
    return bom + text.replace("\n", newline) + end
