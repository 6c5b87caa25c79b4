"""The PostgreSQL server with pgvector that the pgvector tests run on: Debian's own server,
with a pgvector compiled here for any x86-64 CPU.

Debian 12 has no pgvector package (nor bookworm-backports); Debian 13 (trixie) has its source package.
`make postgres` (so `make test`) runs ``python -m memactors.testing.pgvector_build``, which

1. fetches the source package `pgvector` of trixie with ``apt-get source`` — through a private apt
   configuration (its own sources list and index directory in a temporary directory; the machine's apt
   sources are left alone) whose archive is the one this machine's apt already uses for Debian;
2. compiles it against Debian's server headers (`postgresql-server-dev-<major>`) with portable flags:
   ``OPTFLAGS=`` (no ``-march=native``), ``-DDISABLE_DISPATCH`` (no AVX-512 popcount code behind a CPU
   check, which the guard would refuse) and no LLVM bitcode;
3. lays out a private copy of Debian's server — its ``bindir``, ``pkglibdir`` and ``sharedir`` under
   ``<tree>/usr/…`` as hard links (copies where linking is refused) — and ``make install DESTDIR=<tree>``
   adds pgvector to it. PostgreSQL finds its share and lib directories relative to its own programs, so
   the copy is a server with pgvector, and nothing is installed into /usr;
4. refuses the tree when any of its binaries has AVX-512 instructions (`memactors.testing.isa_guard`),
   and writes ``memactors-pgvector.json`` (versions, flags, where the programs are) last.

The tree is ``<virtualenv>/pgvector`` (``make clean`` removes it); it is rebuilt when Debian's server
version, or this recipe, changes. Building needs root only for what `make postgres` installs first (the
server headers and dpkg-dev); it is made in a temporary directory and moved into place whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from memactors.testing import isa_guard
from memactors.testing.pg_binaries import link_or_copy, server_bindir

#: Debian's source package, and the release whose sources have it (Debian 12 has none).
SOURCE_PACKAGE = "pgvector"
SOURCE_SUITE = "trixie"
#: HNSW indexes arrived in pgvector 0.5.0; the store's vector path needs them.
MIN_VERSION = (0, 5, 0)
#: Portable flags: no -march=native, no run-time dispatch to AVX-512 code, no LLVM bitcode.
MAKE_FLAGS = ("OPTFLAGS=", "PG_CPPFLAGS=-DDISABLE_DISPATCH", "with_llvm=no")
#: Bumped when the recipe changes, so trees built by an older one are rebuilt.
RECIPE = 1
STAMP = "memactors-pgvector.json"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


def tree_path() -> Path:
    """Where the server with pgvector lives: ``<virtualenv>/pgvector``."""
    return Path(sys.prefix) / "pgvector"


def read_stamp(tree: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((tree / STAMP).read_text(encoding="utf-8"))
        if isinstance(data, dict):
            return data
    return None


def _pg_config(bindir: Path, *flags: str) -> list[str]:
    out = subprocess.run([str(bindir / "pg_config"), *flags], capture_output=True, text=True, check=True,
                         timeout=30)
    return out.stdout.strip().splitlines()


def debian_server() -> dict[str, str]:
    """Debian's server this machine has: its directories and version (from its pg_config)."""

    bindir = server_bindir()
    if not (bindir / "pg_config").exists():
        raise RuntimeError(f"{bindir}/pg_config is missing: install Debian's postgresql-client package "
                           "(`make postgres` does it)")
    b, lib, share, inc, version = _pg_config(bindir, "--bindir", "--pkglibdir", "--sharedir",
                                             "--includedir-server", "--version")
    return {"bindir": b, "pkglibdir": lib, "sharedir": share, "includedir_server": inc,
            "version": version.split()[1]}  # "PostgreSQL 15.20 (Debian 15.20-0+deb12u1)"


def _missing_tools(server: dict[str, str]) -> list[str]:
    major = server["version"].split(".")[0]
    missing = []
    if not (Path(server["includedir_server"]) / "postgres.h").exists():
        missing.append(f"postgresql-server-dev-{major}")
    for tool, package in (("dpkg-source", "dpkg-dev"), ("gcc", "gcc"), ("make", "make"),
                          ("objdump", "binutils"), ("apt-get", "apt")):
        if shutil.which(tool) is None:
            missing.append(package)
    return missing


def is_current(tree: Path, server: dict[str, str]) -> bool:
    stamp = read_stamp(tree)
    return (stamp is not None and stamp.get("recipe") == RECIPE and stamp.get("server") == server["version"]
            and all((tree / stamp[k]).exists() for k in ("bindir", "vector_so", "vector_control")))


def _debian_archive() -> str:
    """The URI this machine's apt fetches Debian's own release from (not its security archive)."""
    codename = ""
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
            if line.startswith("VERSION_CODENAME="):
                codename = line.split("=", 1)[1].strip().strip('"')
    query = ["apt-get", "indextargets", "--format", "$(REPO_URI)", "Origin: Debian", "Label: Debian"]
    if codename:
        query.append(f"Codename: {codename}")
    out = subprocess.run(query, capture_output=True, text=True, check=False, timeout=60)
    uris = sorted({u.strip() for u in out.stdout.splitlines() if u.strip()})
    if not uris:
        raise RuntimeError("no Debian archive among this machine's apt sources (`apt-get indextargets` "
                           "names none): run `apt-get update` (`make postgres` does)")
    return uris[0]


def _apt(work: Path, *args: str, cwd: Path | None = None) -> None:
    """apt-get with a private configuration: only `SOURCE_SUITE`'s sources, index files under `work`."""
    lists = work / "apt" / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (work / "apt" / "parts").mkdir(exist_ok=True)
    opts = [f"-oDir::Etc::SourceList={work / 'apt' / 'sources.list'}",
            f"-oDir::Etc::SourceParts={work / 'apt' / 'parts'}", f"-oDir::State::Lists={lists}",
            f"-oDir::Cache={work / 'apt' / 'cache'}", "-qq"]
    if os.geteuid() == 0:  # apt's `_apt` user may not write into our temporary directory
        opts.append("-oAPT::Sandbox::User=root")
    done = subprocess.run(["apt-get", *opts, *args], cwd=cwd, capture_output=True, text=True, check=False,
                          timeout=900)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()[-6:]
        raise RuntimeError(f"apt-get {' '.join(args)} failed (exit {done.returncode}): {' | '.join(said)}")


def fetch_source(work: Path) -> Path:
    """Debian's `pgvector` source package of `SOURCE_SUITE`, unpacked (its patches applied) under work."""
    signed = f" [signed-by={KEYRING}]" if KEYRING.exists() else ""
    (work / "apt").mkdir(parents=True, exist_ok=True)
    (work / "apt" / "sources.list").write_text(
        f"deb-src{signed} {_debian_archive()} {SOURCE_SUITE} main\n", encoding="utf-8")
    _apt(work, "update")
    src = work / "src"
    src.mkdir()
    _apt(work, "source", "--only-source", SOURCE_PACKAGE, cwd=src)
    unpacked = [p for p in src.iterdir() if p.is_dir() and p.name.startswith(f"{SOURCE_PACKAGE}-")]
    if len(unpacked) != 1:
        raise RuntimeError(f"apt-get source {SOURCE_PACKAGE} left {sorted(p.name for p in src.iterdir())}")
    return unpacked[0]


def debian_version(source: Path) -> str:
    """The Debian version of the unpacked source package (from its .dsc beside it): `0.8.0-1`."""
    dsc = sorted(source.parent.glob(f"{SOURCE_PACKAGE}_*.dsc"))
    return dsc[0].stem.split("_", 1)[1] if dsc else source.name.split("-", 1)[1]


def source_version(source: Path) -> str:
    m = re.search(r"default_version\s*=\s*'([^']+)'", (source / "vector.control").read_text(encoding="utf-8"))
    if m is None:
        raise RuntimeError(f"{source}/vector.control names no default_version")
    version = m.group(1)
    if tuple(int(x) for x in re.findall(r"\d+", version)[:3]) < MIN_VERSION:
        raise RuntimeError(f"pgvector {version} from Debian's {SOURCE_SUITE} has no HNSW indexes "
                           f"(they arrived in {'.'.join(map(str, MIN_VERSION))})")
    return version


def _make(source: Path, server: dict[str, str], *targets: str) -> None:
    cmd = ["make", "-C", str(source), "-j2", f"PG_CONFIG={server['bindir']}/pg_config", *MAKE_FLAGS, *targets]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()[-8:]
        raise RuntimeError(f"building pgvector failed ({' '.join(cmd)}): {' | '.join(said)}")


def _copy_server(server: dict[str, str], tree: Path) -> None:

    for key in ("bindir", "pkglibdir", "sharedir"):
        src = Path(server[key])
        shutil.copytree(src, tree / src.relative_to("/"), symlinks=True, copy_function=link_or_copy,
                        dirs_exist_ok=True)


def build(tree: Path | None = None, *, force: bool = False) -> Path:
    """The server tree with pgvector at `tree` (default `tree_path()`), built unless it is current."""
    tree = tree or tree_path()
    server = debian_server()
    if not force and is_current(tree, server):
        return tree
    missing = _missing_tools(server)
    if missing:
        raise RuntimeError(f"building pgvector needs Debian's {', '.join(missing)}: `make postgres` installs "
                           "them (as root)")
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="memactors-pgvector-") as tmp:
        work = Path(tmp)
        source = fetch_source(work)
        version = source_version(source)
        _make(source, server)
        staging = tree.parent / f".{tree.name}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            _copy_server(server, staging)
            _make(source, server, "install", f"DESTDIR={staging}")
            rel = {k: str(Path(server[k]).relative_to("/")) for k in ("bindir", "pkglibdir", "sharedir")}
            installed = {"vector_so": f"{rel['pkglibdir']}/vector.so",
                         "vector_control": f"{rel['sharedir']}/extension/vector.control"}
            stamp = {
                "recipe": RECIPE, "server": server["version"], "pgvector": version,
                "source": f"Debian {SOURCE_SUITE}'s source package {SOURCE_PACKAGE} {debian_version(source)}", "make_flags": list(MAKE_FLAGS),
                **rel, **installed,
            }
            for path in installed.values():
                if not (staging / path).exists():
                    raise RuntimeError(f"make install of pgvector left no {path} under {staging}")
            isa_guard.check([staging])
            for directory, _, _ in os.walk(staging):
                os.chmod(directory, 0o755)
            (staging / STAMP).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")
            old = tree.parent / f".{tree.name}.old-{os.getpid()}"
            if tree.exists():
                tree.rename(old)
            staging.rename(tree)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tree


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        tree = build(force="--force" in args)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        print(f"pgvector_build: {e}", file=sys.stderr)
        return 1
    stamp = read_stamp(tree) or {}
    print(f"pgvector {stamp.get('pgvector')} on PostgreSQL {stamp.get('server')} ({stamp.get('source')}, "
          f"{' '.join(stamp.get('make_flags', []))}): {tree}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
