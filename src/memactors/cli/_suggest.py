""""Did you mean …?" for a mistyped command or flag (Python 3.11's argparse has no ``suggest_on_error``).

:class:`SuggestingParser` is the CLI's parser class (subparsers inherit it): a usage error for an
unknown choice (``memactors rn``, ``memactors runs lsit``) or an unrecognised flag (``memactors run
nightly --wiat``) ends with the closest known name, found by :mod:`difflib` among the choices, or among
the flags of the command the line reached. Still exit 2, the usage line first, as argparse prints it.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn, TypeVar, overload

_N = TypeVar("_N")

__all__ = ["SuggestingParser"]

_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$", re.DOTALL)
_UNRECOGNIZED = "unrecognized arguments: "


def _closest(word: str, names: Sequence[str]) -> str | None:
    found = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    if not found and len(word) >= 2:  # a prefix (`memactors mem`) is a good guess too
        found = sorted(n for n in names if n.startswith(word))[:1]
    return found[0] if found else None


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors suggest the closest command or flag."""

    #: The command line being parsed (set by `parse_args` on the parser that was called).
    _argv: list[str] | None = None

    @overload
    def parse_args(self, args: Iterable[str] | None = None, namespace: None = None) -> argparse.Namespace: ...
    @overload
    def parse_args(self, args: Iterable[str] | None, namespace: _N) -> _N: ...
    @overload
    def parse_args(self, *, namespace: _N) -> _N: ...

    def parse_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> Any:
        import sys

        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(self._argv if args is not None else None, namespace)

    def error(self, message: str) -> NoReturn:
        hint = self._hint(message)
        super().error(f"{message}\n{hint}" if hint else message)

    def _hint(self, message: str) -> str | None:
        if match := _INVALID_CHOICE.search(message):
            choices = re.findall(r"'([^']*)'", match.group(2))
            guess = _closest(match.group(1), choices)
            return f"did you mean '{guess}'?" if guess else None
        if message.startswith(_UNRECOGNIZED):
            flags = self._reached_flags()
            hints = []
            for word in message[len(_UNRECOGNIZED):].split():
                if word.startswith("-") and (guess := _closest(word.split("=", 1)[0], flags)):
                    hints.append(f"did you mean '{guess}' for '{word}'?")
            return "\n".join(hints) or None
        return None

    def _reached_flags(self) -> list[str]:
        """The flags of this parser and of each subcommand the command line went into."""
        flags: list[str] = []
        parser: argparse.ArgumentParser = self
        for word in [*(self._argv or []), ""]:
            flags += [opt for opt in parser._option_string_actions if opt.startswith("--")]
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            child = next((s.choices[word] for s in subs if word in s.choices), None)
            if child is not None:
                parser = child
        return sorted(set(flags))
