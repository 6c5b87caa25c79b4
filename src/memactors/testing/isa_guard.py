"""Which machine code a binary needs: a guard against server binaries and extensions built for a newer
CPU than the one that will run them (a pgvector built with AVX-512 once killed every backend that
built an HNSW index with SIGILL on an AVX2 machine).

The rule is simple and strict: **no AVX-512 (or AMX) at all**, whether or not the running CPU has it and
whether or not the code sits behind a run-time CPU check, so the next non-portable build is caught on the
machine that makes it, not on the next machine that runs it. An instruction counts when `objdump -d`
shows any of

* an EVEX-encoded instruction (its first opcode byte is 0x62, which in 64-bit mode means nothing else):
  every AVX-512 instruction is one, including those on xmm/ymm registers only;
* a zmm register, xmm16–31 or ymm16–31, an opmask register (``%k0``–``%k7``), an embedded broadcast
  (``{1toN}``) or rounding (``{rn-sae}``…): AVX-512's operands;
* a tile register (``%tmm0``–``%tmm7``): AMX.

    python -m memactors.testing.isa_guard DIR_OR_FILE…   # exit 1, naming each file, if any has some

Results are cached per file (device, inode, size, mtime) in the temporary directory, so a second scan of
the same server (hard links included) costs nothing; `objdump` of PostgreSQL's `postgres` takes seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

#: Bumped when the rule changes, so cached verdicts of an older rule are not reused.
RULE = "avx512-amx-1"

_LINE = re.compile(r"^\s*[0-9a-f]+:\t((?:[0-9a-f]{2} )+)\s*\t(.+)$")
_OPERANDS = re.compile(
    r"%zmm\d+|%[xy]mm(?:1[6-9]|2\d|3[01])\b|%k[0-7]\b|\{1to\d+\}|\{r[nduz]-sae\}|\{sae\}|%tmm[0-7]\b")
#: Prefixes that may stand before an EVEX instruction (address size, segment overrides).
_EVEX_PREFIXES = {"67", "26", "2e", "36", "3e", "64", "65"}


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _offending(line: str) -> bool:
    m = _LINE.match(line)
    if m is None:  # a wrapped line of an instruction's bytes, a label, a section header
        return False
    raw, text = m.group(1).split(), m.group(2)
    while raw and raw[0] in _EVEX_PREFIXES:
        raw = raw[1:]
    return (bool(raw) and raw[0] == "62") or _OPERANDS.search(text) is not None


def scan_file(path: Path, *, limit: int = 3) -> list[str]:
    """The first `limit` offending instructions in `path` (`address: mnemonic operands`), or [] for a
    clean file. Raises RuntimeError when objdump cannot read an ELF file."""
    proc = subprocess.Popen(["objdump", "-d", "-w", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    found: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if _offending(line):
            address = line.split(":", 1)[0].strip()
            found.append(f"{address}: {line.rsplit(chr(9), 1)[-1].strip()}")
            if len(found) >= limit:
                proc.kill()
                break
    _, err = proc.communicate()
    if not found and proc.returncode != 0:
        raise RuntimeError(f"objdump -d {path} failed: {err.strip()[-300:]}")
    return found


def _files(paths: Iterable[Path]) -> list[Path]:
    """Every ELF file under `paths` (files, or directories walked), symlinks to files resolved and each
    real file once."""
    out: dict[Path, None] = {}
    for p in paths:
        if p.is_dir():
            for directory, _, names in os.walk(p):
                for name in sorted(names):
                    f = Path(directory) / name
                    if f.is_file() and _is_elf(f):
                        out[f.resolve()] = None
        elif p.is_file() and _is_elf(p):
            out[p.resolve()] = None
    return list(out)


def _cache_path() -> Path:
    return Path(tempfile.gettempdir()) / f"memactors-isa-guard-{os.geteuid()}.json"


def _key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha1(f"{RULE}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()


def scan(paths: Iterable[Path], *, cache: bool = True) -> dict[Path, list[str]]:
    """Each ELF file under `paths` that has AVX-512 or AMX instructions, with the first few of them."""
    store: dict[str, list[str]] = {}
    if cache:
        with contextlib.suppress(OSError, ValueError):
            store = json.loads(_cache_path().read_text(encoding="utf-8"))
    dirty = False
    bad: dict[Path, list[str]] = {}
    for f in _files(paths):
        key = _key(f)
        if key not in store:
            store[key] = scan_file(f)
            dirty = True
        if store[key]:
            bad[f] = store[key]
    if cache and dirty:
        with contextlib.suppress(OSError):
            fd, tmp = tempfile.mkstemp(dir=_cache_path().parent, prefix=".memactors-isa-guard-")
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(store, out)
            os.replace(tmp, _cache_path())
    return bad


def check(paths: Iterable[Path], *, cache: bool = True) -> None:
    """Raise RuntimeError naming every file under `paths` with AVX-512/AMX instructions."""
    paths = list(paths)
    bad = scan(paths, cache=cache)
    if bad:
        lines = [f"{f}: {'; '.join(found)}" for f, found in sorted(bad.items())]
        raise RuntimeError("not portable: these binaries contain AVX-512/AMX instructions, which CPUs "
                           "without them (AVX2 at most) kill with SIGILL; rebuild them without "
                           "-march=native (docs/dependencies.md):\n  " + "\n  ".join(lines))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m memactors.testing.isa_guard DIR_OR_FILE…", file=sys.stderr)
        return 2
    try:
        check([Path(a) for a in args])
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"isa_guard: no AVX-512/AMX instructions in {len(_files(Path(a) for a in args))} binaries under "
          + ", ".join(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
