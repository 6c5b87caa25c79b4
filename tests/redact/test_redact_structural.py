"""The redactor generalizes — every format of the generated corpus (tests/support_corpus.py: the
structural forms, the vendor prefixes, one sample per gitleaks rule, memactors' own formats) is redacted as a
whole text and line by line (a provider's stderr), and the structural rules leave ordinary text alone.

The daemon-level test (every field, every surface) is tests/hardening/test_hardening_corpus.py.
"""

from __future__ import annotations

import pytest

from memactors.redact import REDACTED, LineRedactor, default, redact, redact_tail
from support_corpus import from_rules, full, structural

pytestmark = pytest.mark.req6


def _leaks(samples, fn) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(s.id, fn(s.text)[:160]) for s in samples if s.found_in(fn(s.text))]


def _by_lines(text: str) -> str:
    lines = LineRedactor()
    return "\n".join(line for line in map(lines.line, text.split("\n")) if line is not None)


def test_the_corpus_has_three_hundred_formats_across_the_families() -> None:
    ids = [s.id for s in full()]
    assert len(ids) == len(set(ids)) >= 300
    assert len(structural()) >= 250
    # one generated sample for nearly every gitleaks rule (a few patterns have no sample the small
    # generator can satisfy: lookarounds)
    gitleaks = [r for r in default.rules if r.secret_group is not None]
    assert len(from_rules()) >= 0.9 * len(gitleaks)
    assert all(s.random_parts for s in full())


def test_every_format_is_redacted_as_a_whole_text() -> None:
    assert _leaks(full(), redact) == []


def test_every_format_is_redacted_line_by_line_as_provider_stderr_is() -> None:
    assert _leaks(full(), _by_lines) == []


def test_every_format_is_redacted_flattened_onto_one_line() -> None:
    # A one-line field (a harness, branch or session name) holds a sample with its line breaks gone.
    assert [(s.id, redact(s.one_line)[:160]) for s in full() if s.found_in(redact(s.one_line))] == []


def test_every_format_is_redacted_in_a_tail_that_starts_anywhere() -> None:
    # The 4 KiB stderr tail: the beginning may be cut. Whole samples after a cut line stay redacted.
    assert _leaks(full(), lambda t: redact_tail("...cut line\n" + t)) == []


def test_the_redacted_corpus_is_a_fixed_point() -> None:
    for sample in full():
        once = redact(sample.text)
        assert redact(once) == once, sample.id
        assert REDACTED in once, sample.id


def test_every_own_rule_fires_on_a_format_of_the_corpus() -> None:
    ours = [r for r in default.rules if r.secret_group is None]
    texts = [s.text for s in structural()]
    silent = [r.id for r in ours if not any(list(r.spans(t, redact)) for t in texts if r in default.candidates(t))]
    # The older rules have their samples in tests/redact/test_redact.py; every context rule has one here.
    older = {"private-key", "url-userinfo-token", "github-fine-grained-pat", "docker-pat", "aws-secret-access-key",
             "slack-token", "slack-webhook-url", "anthropic-api-key", "openai-api-key", "jwt",
             "azure-sas-signature", "vault-batch-token-short", "huggingface-token", "datadog-key", "mailgun-api-key",
             "newrelic-key", "telegram-bot-token", "discord-webhook-url", "discord-bot-token",
             "atlassian-api-token-any-context", "mapbox-secret-token", "okta-ssws-token", "bearer-token",
             "password-assignment", "password-quoted", "generic-secret-quoted", "generic-secret-assignment",
             "github-pat", "gitlab-pat", "aws-access-key-id", "url-userinfo-password", "authorization-header",
             "netrc-password", "azure-storage-account-key"}
    assert [rid for rid in silent if rid not in older] == []


@pytest.mark.parametrize("text", [
    "Refactored the ledger module; the suite is green and CI passed.",
    "PWD=/home/dev/src/api",
    "password: changeme",
    "token = request.headers.get('X-Token')",
    "export PATH=/usr/local/bin:$PATH",
    "api_key: ${API_KEY}",
    "--password-stdin",
    "mysql -u root -p app",
    "docker login -u bob --password-stdin registry.example",
    "Authorization: Bearer $TOKEN",
    "Set-Cookie: Path=/; HttpOnly",
    "The Authorization header is missing",
    "key=value pairs are parsed by parse_kv()",
    "ssh-keygen -t ed25519 -C dev@example.com",
    "kubectl get secret db -o yaml",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "data:\n  replicas: 3\n",  # data: outside a Secret
    "apiVersion: v1\nkind: ConfigMap\ndata:\n  LOG_LEVEL: debug\n",
    "edited src/memactors/redact.py and tests/test_redact_structural.py",
    "commit 3f2a9c1e5b7d4a6f8e0c2b4d6f8a0c2e4b6d8f0a",
])
def test_ordinary_text_survives_the_structural_rules(text: str) -> None:
    assert redact(text) == text


def test_a_password_made_only_of_letters_after_password_is_redacted() -> None:
    assert redact("PASSWORD=hunterhunter\n") == f"PASSWORD={REDACTED}\n"
    assert redact("dbname=app password=letmein host=db") == f"dbname=app password={REDACTED} host=db"
    assert redact("password: correcthorse") == f"password: {REDACTED}"


def test_a_secret_whose_context_is_on_an_earlier_line_is_redacted_on_its_own_line() -> None:
    lines = LineRedactor()
    shown = [lines.line(t) for t in ("apiVersion: v1", "kind: Secret", "stringData:", "  admin: plainwords",
                                      "  token: abc", "other: value")]
    assert shown == ["apiVersion: v1", "kind: Secret", "stringData:", f"  admin: {REDACTED}", f"  token: {REDACTED}",
                     "other: value"]


def test_a_ppk_block_is_dropped_whole_from_streamed_lines() -> None:
    ppk = next(s for s in structural() if s.id == "s31-putty-ppk-v3")
    lines = LineRedactor()
    shown = [line for line in map(lines.line, ppk.text.split("\n")) if line is not None]
    assert shown[0] == REDACTED
    assert not any(ppk.found_in(line) for line in shown)
