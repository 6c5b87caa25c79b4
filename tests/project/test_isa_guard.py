"""No server binary or extension the tests run may contain AVX-512 (or AMX) instructions.

The wheel's pgvector, built with -march=native on an AVX-512 machine, killed PostgreSQL's backends with
SIGILL on an AVX2 CPU. `memactors.testing.isa_guard` refuses such code wherever it sits (behind a CPU
check or not), so the next non-portable build fails here, naming the file, on the machine that makes it.
The guard is shown to catch binaries planted for it (gcc with -mavx512f), and then run over every server
program and library the PostgreSQL tests start.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from memactors.testing import isa_guard

ZMM = """
#include <immintrin.h>
void add16(float *a, const float *b) {
    _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b)));
}
"""
#: AVX-512VL on xmm registers only: no zmm in sight, but EVEX-encoded all the same.
EVEX_XMM = """
#include <immintrin.h>
__m128i tern(__m128i a, __m128i b, __m128i c) { return _mm_ternarylogic_epi32(a, b, c, 0x96); }
"""
#: AVX2 is allowed (x86-64-v3): the guard is about AVX-512, not about vector code.
AVX2 = """
#include <immintrin.h>
__m256 add8(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
int add(int a, int b) { return a + b; }
"""


def shared_object(tmp_path: Path, name: str, source: str, *flags: str) -> Path:
    c = tmp_path / f"{name}.c"
    c.write_text(source, encoding="utf-8")
    out = tmp_path / f"{name}.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", *flags, str(c), "-o", str(out)], check=True,
                   capture_output=True, timeout=120)
    return out


def test_the_guard_names_a_planted_avx512_library_and_passes_a_clean_one(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    bad = shared_object(lib, "planted_zmm", ZMM, "-mavx512f")
    clean = shared_object(lib, "clean_avx2", AVX2, "-mavx2")
    (lib / "vector.control").write_text("comment = 'not a binary'\n", encoding="utf-8")

    isa_guard.check([clean], cache=False)  # AVX2 and plain code pass
    with pytest.raises(RuntimeError) as caught:
        isa_guard.check([lib], cache=False)
    message = str(caught.value)
    assert str(bad) in message and "zmm" in message
    assert str(clean) not in message and "vector.control" not in message


def test_the_guard_catches_evex_code_that_names_no_zmm_register(tmp_path: Path) -> None:
    evex = shared_object(tmp_path, "planted_evex", EVEX_XMM, "-mavx512f", "-mavx512vl")
    assert "zmm" not in subprocess.run(["objdump", "-d", str(evex)], capture_output=True, text=True,
                                       check=True).stdout
    found = isa_guard.scan([evex], cache=False)
    assert list(found) == [evex] and "vpternlogd" in found[evex][0]


def test_the_guard_command_fails_naming_the_file(tmp_path: Path) -> None:
    """`make postgres` runs the guard as a command: exit 1 and the file's name on stderr."""
    import sys

    bad = shared_object(tmp_path, "planted", ZMM, "-mavx512f")
    clean = shared_object(tmp_path, "clean", AVX2, "-mavx2")
    failed = subprocess.run([sys.executable, "-m", "memactors.testing.isa_guard", str(tmp_path)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert failed.returncode == 1 and str(bad) in failed.stderr and str(clean) not in failed.stderr
    passed = subprocess.run([sys.executable, "-m", "memactors.testing.isa_guard", str(clean)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert passed.returncode == 0, passed.stderr


def test_a_cached_verdict_follows_the_file_not_its_name(tmp_path: Path, monkeypatch) -> None:
    """The cache (so a second scan of the servers costs nothing) is keyed by the file itself: a clean
    library replaced by a planted one under the same name is scanned again and caught."""
    monkeypatch.setattr(isa_guard, "_cache_path", lambda: tmp_path / "cache.json")
    target = tmp_path / "ext.so"
    shared_object(tmp_path, "clean", AVX2, "-mavx2").rename(target)
    assert isa_guard.scan([target]) == {}
    shared_object(tmp_path, "planted", ZMM, "-mavx512f").rename(target)
    assert list(isa_guard.scan([target])) == [target]


def test_no_server_binary_or_extension_the_tests_run_has_avx512() -> None:
    """Every program and library of both servers the tests start: Debian's (all PostgreSQL tests but
    the pgvector ones) and the pgvector tree `make postgres` builds (its own copy of Debian's server,
    with pgvector compiled in)."""
    from memactors.testing.pgvector_build import debian_server
    from memactors.testing.postgres import pgvector_install

    server = debian_server()
    tree = pgvector_install()
    isa_guard.check([Path(server["bindir"]), Path(server["pkglibdir"]), tree])
    # …and the scan saw the servers' real programs, not an empty directory
    files = isa_guard._files([tree])
    assert any(f.name == "vector.so" for f in files) and any(f.name == "postgres" for f in files)
