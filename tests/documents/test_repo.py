"""Repository keys (repo.py; docs/contracts.md, `sessions[].repo`) against real git repositories made in tmp_path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from memactors.errors import InvalidArgument
from memactors.repo import (
    GitUnavailable,
    RepoInfo,
    RepoResolver,
    explicit_key,
    normalise_remote,
    relative_path,
    resolve_repo,
    scope_for,
)

pytestmark = pytest.mark.usefixtures("isolated_git")


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def make_repo(path: Path, *remotes: tuple[str, str], commit: bool = False) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    for name, url in remotes:
        git(path, "remote", "add", name, url)
    if commit:
        git(path, "config", "user.email", "test@example.invalid")
        git(path, "config", "user.name", "Test")
        (path / "README").write_text("x\n")
        git(path, "add", "README")
        git(path, "commit", "-q", "-m", "init")
    return Path(git(path, "rev-parse", "--show-toplevel"))


# --- normalise_remote -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("git@forge.example:acme/api.git", "forge.example/acme/api"),
        ("https://user:tok@Forge.Example:8443/acme/api.git", "forge.example/acme/api"),
        ("ssh://git@forge.example:2222/acme/api", "forge.example/acme/api"),
        ("https://forge.example/acme/api/", "forge.example/acme/api"),
        ("https://forge.example/acme/api.git/", "forge.example/acme/api"),
        ("http://FORGE.example/Acme/API", "forge.example/Acme/API"),
        ("git+ssh://git@forge.example/acme/api.git", "forge.example/acme/api"),
        ("forge.example:acme/api", "forge.example/acme/api"),
        ("  git@forge.example:group/sub/api.git\n", "forge.example/group/sub/api"),
        ("git://forge.example/acme/api.git", None),
        ("file:///srv/git/api.git", None),
        ("/srv/git/api.git", None),
        ("../api", None),
        ("C:\\src\\api", None),
        ("https://forge.example/", None),
        ("https://forge.example/acme/../api", None),
        ("", None),
        ("https://[::1/acme", None),
    ],
)
def test_normalise_remote(url: str, key: str | None) -> None:
    assert normalise_remote(url) == key


def test_scope_and_explicit_keys() -> None:
    assert scope_for("forge.example/acme/api") == "project:forge.example/acme/api"
    assert RepoInfo(key="local/tmp/x", toplevel="/tmp/x").scope == "project:local/tmp/x"
    assert explicit_key("git@forge.example:acme/api.git") == "forge.example/acme/api"
    assert explicit_key("forge.example/acme/api/") == "forge.example/acme/api"
    with pytest.raises(InvalidArgument):
        scope_for("")
    with pytest.raises(InvalidArgument):
        explicit_key("  ")


# --- resolve_repo with real repositories ---------------------------------------------------------


async def test_ssh_style_origin(tmp_path: Path) -> None:
    top = make_repo(tmp_path / "api", ("origin", "git@forge.example:acme/api.git"))
    info = await resolve_repo(str(top))
    assert info == RepoInfo(key="forge.example/acme/api", toplevel=str(top))


async def test_https_remote_with_credentials_and_port(tmp_path: Path) -> None:
    top = make_repo(tmp_path / "api", ("origin", "https://user:tok@Forge.Example:8443/acme/api.git"))
    info = await resolve_repo(str(top))
    assert info is not None and info.key == "forge.example/acme/api"
    assert "tok" not in info.key


async def test_no_remote_is_a_local_key(tmp_path: Path) -> None:
    top = make_repo(tmp_path / "x" / "repo", commit=True)
    info = await resolve_repo(str(top))
    assert info == RepoInfo(key=f"local{top}", toplevel=str(top))
    assert info.key.startswith("local/")


async def test_first_remote_when_no_origin(tmp_path: Path) -> None:
    top = make_repo(
        tmp_path / "api",
        ("upstream", "git@forge.example:acme/api.git"),
        ("zfork", "git@forge.example:someone/api.git"),
    )
    info = await resolve_repo(str(top))
    assert info is not None and info.key == "forge.example/acme/api"


async def test_origin_wins_over_other_remotes(tmp_path: Path) -> None:
    top = make_repo(
        tmp_path / "api",
        ("aaa", "git@forge.example:someone/api.git"),
        ("origin", "https://forge.example/acme/api.git"),
    )
    info = await resolve_repo(str(top))
    assert info is not None and info.key == "forge.example/acme/api"


async def test_unkeyable_remote_falls_back_to_local_key(tmp_path: Path) -> None:
    top = make_repo(tmp_path / "api", ("origin", "/srv/git/api.git"))
    info = await resolve_repo(str(top))
    assert info is not None and info.key == f"local{top}"


async def test_nested_cwd_resolves_to_the_same_key(tmp_path: Path) -> None:
    top = make_repo(tmp_path / "api", ("origin", "git@forge.example:acme/api.git"))
    nested = top / "internal" / "ledger"
    nested.mkdir(parents=True)
    assert await resolve_repo(str(nested)) == await resolve_repo(str(top))


async def test_cwd_outside_any_repository_has_no_key(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert await resolve_repo(str(tmp_path)) is None
    assert await resolve_repo(str(plain)) is None


async def test_missing_or_relative_cwd_has_no_key(tmp_path: Path) -> None:
    assert await resolve_repo(str(tmp_path / "does-not-exist")) is None
    assert await resolve_repo("relative/dir") is None
    assert await resolve_repo("") is None


async def test_git_location_env_of_a_hook_does_not_redirect_resolution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = make_repo(tmp_path / "other", ("origin", "git@forge.example:acme/other.git"))
    top = make_repo(tmp_path / "api", ("origin", "git@forge.example:acme/api.git"))
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    info = await resolve_repo(str(top))
    assert info is not None and info.key == "forge.example/acme/api"


async def test_resolver_caches_found_repositories_only(tmp_path: Path) -> None:
    resolver = RepoResolver(max_entries=1)
    late = tmp_path / "late"
    assert await resolver.resolve(str(late)) is None
    top = make_repo(late, ("origin", "git@forge.example:acme/late.git"))
    first = await resolver.resolve(str(top))
    assert first is not None and first.key == "forge.example/acme/late"
    # A cached answer survives a remote change until the cache is cleared.
    git(top, "remote", "set-url", "origin", "git@forge.example:acme/renamed.git")
    assert await resolver.resolve(str(top)) == first
    resolver.clear()
    renamed = await resolver.resolve(str(top))
    assert renamed is not None and renamed.key == "forge.example/acme/renamed"
    # Bounded: a second entry evicts the first.
    other = make_repo(tmp_path / "other", ("origin", "git@forge.example:acme/other.git"))
    await resolver.resolve(str(other))
    git(top, "remote", "set-url", "origin", "git@forge.example:acme/third.git")
    third = await resolver.resolve(str(top))
    assert third is not None and third.key == "forge.example/acme/third"


async def test_missing_git_executable_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(GitUnavailable):
        await RepoResolver().resolve(str(tmp_path))


def test_resolver_rejects_a_zero_sized_cache() -> None:
    with pytest.raises(InvalidArgument):
        RepoResolver(max_entries=0)


# --- relative_path ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "cwd", "expected"),
    [
        ("/r/api/internal/ledger.go", "/r/api", "internal/ledger.go"),
        ("/r/api/internal/../cmd/main.go", "/r/api", "cmd/main.go"),
        ("ledger_test.go", "/r/api/internal", "internal/ledger_test.go"),
        ("./a//b/./c.py", "/r/api", "a/b/c.py"),
        ("../cmd/main.go", "/r/api/internal", "cmd/main.go"),
        ("../../etc/passwd", "/r/api/internal", None),
        ("../api2/x.go", "/r/api", None),
        ("/r/api2/x.go", "/r/api", None),
        ("/etc/passwd", "/r/api", None),
        ("/r/api", "/r/api", "."),
        ("", "/r/api", None),
        ("x.go", "relative/cwd", None),
    ],
)
def test_relative_path(path: str, cwd: str, expected: str | None) -> None:
    assert relative_path(path, "/r/api", cwd) == expected


def test_relative_path_with_a_trailing_slash_toplevel() -> None:
    assert relative_path("/r/api/a.go", "/r/api/", "/r/api") == "a.go"
    assert relative_path("/a.go", "/", "/") == "a.go"
