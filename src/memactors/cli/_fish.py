"""A fish completion script for the `memactors` parser (shtab writes bash and zsh only).

Generated from the argparse tree, so it always matches the commands: every command path (``runs``,
``runs logs``, ``memory provider check``) is listed, a helper works out which path the command line is
at (skipping options and the value of an option that takes one), and each path's subcommands, options
and positional choices are offered there with their help text.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

__all__ = ["fish_script"]


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _short(help_text: str | None) -> str:
    text = " ".join((help_text or "").split())
    return text if len(text) <= 80 else text[:79] + "…"


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, (*path, name))


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
            out += [(name, helps.get(name)) for name in action.choices]
    return out


def fish_script(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    fn = "__" + prog.replace("-", "_")
    tree = list(_walk(parser))
    paths = [" ".join(path) for path, _ in tree if path]
    valued = sorted({opt for _, p in tree for a in p._actions if a.option_strings and a.nargs != 0
                     for opt in a.option_strings})
    lines = [
        f"# fish completion for {prog}: `{prog} completion fish > ~/.config/fish/completions/{prog}.fish`",
        f"set -g {fn}_paths {' '.join(_quote(p) for p in paths)}",
        f"set -g {fn}_valued {' '.join(_quote(v) for v in valued)}",
        f"function {fn}_current --description 'the {prog} command path typed so far'",
        "    set -l path ''",
        "    set -l skip 0",
        "    for token in (commandline -opc)[2..-1]",
        "        if test $skip = 1",
        "            set skip 0",
        "            continue",
        "        end",
        "        if string match -q -- '-*' $token",
        f"            if contains -- $token ${fn}_valued",
        "                set skip 1",
        "            end",
        "            continue",
        "        end",
        "        set -l next (string trim -- \"$path $token\")",
        f"        if contains -- $next ${fn}_paths",
        "            set path $next",
        "        else",
        "            break",
        "        end",
        "    end",
        "    echo $path",
        "end",
        f"function {fn}_at --description 'true when the command line is at this {prog} command path'",
        f"    set -l here ({fn}_current)",
        "    test \"$here\" = \"$argv[1]\"",
        "end",
        f"complete -c {prog} -f",
    ]
    for path, sub in tree:
        condition = f"{fn}_at " + _quote(" ".join(path))
        at = f"-n {_quote(condition)}"
        for name, help_text in _subcommands(sub):
            lines.append(f"complete -c {prog} {at} -a {_quote(name)} -d {_quote(_short(help_text))}")
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if not action.option_strings:
                if action.choices:
                    for choice in action.choices:
                        lines.append(f"complete -c {prog} {at} -a {_quote(str(choice))} "
                                     f"-d {_quote(_short(action.help))}")
                continue
            flags = []
            for opt in action.option_strings:
                flags.append(f"-l {opt[2:]}" if opt.startswith("--") else f"-s {opt[1:]}")
            extra = ""
            if action.nargs != 0:
                extra = f" -x -a {_quote(' '.join(map(str, action.choices)))}" if action.choices else " -r -F"
            lines.append(f"complete -c {prog} {at} {' '.join(flags)}{extra} -d {_quote(_short(action.help))}")
    return "\n".join(lines) + "\n"
