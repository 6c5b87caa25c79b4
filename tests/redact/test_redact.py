"""The shared redactor (SPEC-0030 REQ-6): true positives, false positives, idempotence, control characters.

Fake credentials are assembled from pieces at run time so this repository's own files do not trip
secret scanners; the random-looking bodies keep each sample above the rules' entropy floors.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memactors import gitleaks_rules
from memactors.redact import (
    REDACTED,
    Redactor,
    RulesError,
    default,
    load_rules,
    redact,
    redact_many,
    redact_obj,
    redact_tail,
    rule_ids,
    shannon_entropy,
    strip_control,
)
from support_secrets import (
    ADVERSARIAL,
    JWT,
    PEM_BODY,
    R36,
    R36B,
    R43,
    R93,
    TRUE_POSITIVES,
    UPPER16,
    j,
)


@pytest.mark.req6
@pytest.mark.parametrize(("rule", "before", "secret", "after"), TRUE_POSITIVES,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(TRUE_POSITIVES)])
def test_true_positives_are_replaced_and_surroundings_kept(rule: str, before: str, secret: str, after: str) -> None:
    assert rule in rule_ids()
    out = redact(before + secret + after)
    assert out == before + REDACTED + after
    assert secret not in out


HAND_SAMPLED_RULES = {r[0] for r in TRUE_POSITIVES}


@pytest.mark.req6
def test_every_hand_written_rule_has_a_true_positive_sample() -> None:
    # Rules derived from gitleaks carry its secret_group; gitleaks' own test suite covers their samples.
    # The context rules have theirs in the generated corpus (tests/redact/test_redact_structural.py checks that
    # each fires on one); the older hand-written rules have them here.
    hand = {rule.id for rule in default.rules if rule.secret_group is None and rule.id in HAND_SAMPLED_RULES}
    assert hand == {r[0] for r in TRUE_POSITIVES if r[0] in hand}
    assert {r[0] for r in TRUE_POSITIVES} <= set(rule_ids())


@pytest.mark.req6
def test_rules_carry_the_whole_gitleaks_set_from_the_installed_package_with_keywords() -> None:
    rules = {rule.id: rule for rule in default.rules}
    document = tomllib.loads(gitleaks_rules.config_text())
    assert document["title"] == "gitleaks config" and len(document["rules"]) >= 200
    # Every gitleaks rule with a regex is there (under gitleaks:<id> where one of ours has its id),
    # but generic-api-key, which our generic-* rules replace.
    for raw in document["rules"]:
        if "regex" in raw and raw["id"] not in gitleaks_rules.SKIP:
            ours = f"gitleaks:{raw['id']}" if f"gitleaks:{raw['id']}" in rules else raw["id"]
            assert ours in rules and rules[ours].secret_group is not None, raw["id"]
    for rule_id in ("stripe-access-token", "gcp-api-key", "npm-access-token", "pypi-upload-token",
                    "sendgrid-api-token", "vault-service-token", "aws-access-token", "slack-bot-token"):
        assert rule_id in rules
    # Nothing of gitleaks is kept in the repository: the rule file only asks for it.
    text = resources.files("memactors.data").joinpath("redaction_rules.toml").read_text("utf-8")
    assert 'include = "gitleaks"' in text and "zendesk" not in text


@pytest.mark.req6
def test_every_rule_compiles_under_python_re_and_has_a_keyword_for_the_prefilter() -> None:
    # The rule file and gitleaks' set translated: each is a compiled Python pattern, and each names at
    # least one keyword, so ordinary text runs none of them (the automaton finds no keyword).
    assert len(default.rules) >= 250
    for rule in default.rules:
        assert isinstance(rule.pattern, re.Pattern), rule.id
        assert rule.keywords, f"{rule.id} has no keyword: it would run on every string"
        assert all(k == k.lower() and k.strip() for k in rule.keywords), rule.id
    assert default.candidates("Refactored the ledger module, the suite is green") == []


def test_gitleaks_translation_spells_re2_for_python() -> None:
    assert gitleaks_rules.to_python(r"[[:alnum:]]{8}\z") == r"[A-Za-z0-9]{8}\Z"
    assert gitleaks_rules.to_python(r"ab(?:(?i)cd|ef)gh") == r"ab(?:(?i:cd|ef))gh"
    assert gitleaks_rules.to_python(r"(?i)[\w.-]{0,50}?(?:key)x.*y") == r"(?i)(?:key)x.{0,256}y"
    with pytest.raises(gitleaks_rules.GitleaksError, match="no gitleaks configuration"):
        gitleaks_rules.extract(b"\x7fELF not gitleaks")
    assert gitleaks_rules.extract(b"\0\0# This file has been auto-generated\ntitle = 'x'\n\0\xff") == \
        "# This file has been auto-generated\ntitle = 'x'\n"


@pytest.mark.req6
def test_a_rule_runs_only_when_one_of_its_keywords_occurs() -> None:
    stripe = next(rule for rule in default.rules if rule.id == "stripe-access-token")
    assert stripe not in default.candidates("an ordinary sentence about ledgers")
    assert stripe in default.candidates("key SK_LIVE_ in upper case")
    plain = "Refactored the ledger module and fixed the flaky test in CI. " * 20
    ran = default.candidates(plain)
    assert len(ran) < len(default.rules) // 10
    assert redact(plain) == plain


@pytest.mark.req6
def test_keyword_prefilter_changes_no_result() -> None:
    everything = Redactor(rules=tuple(attrs.evolve(r, keywords=()) for r in default.rules))
    for _, before, secret, after in TRUE_POSITIVES:
        text = before + secret + after
        assert redact(text) == everything.redact(text)


@pytest.mark.req6
def test_a_url_password_containing_at_signs_is_redacted_up_to_the_last_at_before_the_host() -> None:
    assert redact("git clone https://bob:p@ss@word@forge.example/acme/api.git") == \
        "git clone https://[REDACTED]@forge.example/acme/api.git"
    assert redact("https://bob:pw@forge.example/a@b") == "https://[REDACTED]@forge.example/a@b"


@pytest.mark.req6
def test_req6_a_token_in_the_result_never_leaves_the_daemon_redactor() -> None:
    token = "ghp_" + R36
    result_text = f"Opened the PR using {token}; CI is green.\n"
    out = redact(result_text)
    assert out == "Opened the PR using [REDACTED]; CI is green.\n"
    assert token not in out and R36 not in out


@pytest.mark.req6
def test_a_token_longer_than_36_characters_is_taken_whole() -> None:
    token = j("gh", "p_", R36, R36B[:6])
    assert redact(f"t={token} x") == "t=[REDACTED] x"


@pytest.mark.req6
def test_private_key_without_end_is_redacted_to_the_end_of_the_text() -> None:
    text = j("log line\n-----BEGIN EC ", "PRIVATE KEY-----\n", PEM_BODY, "more key material ...\n(truncated)")
    assert redact(text) == "log line\n" + REDACTED


@pytest.mark.req6
def test_two_private_keys_each_redacted_text_between_kept() -> None:
    block = j("-----BEGIN RSA ", "PRIVATE KEY-----\n", PEM_BODY, "-----END RSA ", "PRIVATE KEY-----")
    assert redact(f"{block}\nbetween\n{block}") == f"{REDACTED}\nbetween\n{REDACTED}"


@pytest.mark.req6
def test_url_credentials_keep_scheme_host_and_path() -> None:
    out = redact("https://user:tok3n-value@Forge.Example:8443/acme/api.git")
    assert out == "https://[REDACTED]@Forge.Example:8443/acme/api.git"


FALSE_POSITIVES: list[str] = [
    # code
    'def handler(request):\n    token = request.headers.get("X-Token")\n    return verify(token)\n',
    "func (s *Store) Save(ctx context.Context, key string, value []byte) error {\n\treturn nil\n}\n",
    'password = os.environ["X"]',
    "password = getpass.getpass()",
    "token = self._make_token_from_request(request)",
    "DB_PASSWORD = settings.DB_PASSWORD_FROM_VAULT",
    'api_key: "${OPENAI_API_KEY}"',
    "token: ${{ secrets.GITHUB_TOKEN }}",
    "Authorization: Bearer $TOKEN",
    'headers = {"Authorization": f"Bearer {token}"}',
    "if token == expected_token:",
    "const accessKey = process.env.ACCESS_KEY;",
    "    self.allow_credentials = allow_credentials",
    "    private_key: EllipticCurvePrivateKey,",
    "def refresh(token: RefreshTokenType) -> AccessTokenResponse:",
    "MLKEM768X25519PrivateKey = rust_openssl.hpke.MLKEM768X25519PrivateKey",
    'if line.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----"):\n    parse(line)\nrest of the file',
    # short or low-entropy values
    "password: changeme",
    "password: str",
    "password: None",
    "password = request.form",
    "password: required",
    'password = "${DB_PASSWORD}"',
    "PASSWORD=$DB_PASSWORD",
    "password=get_password()",
    'secret = "aaaaaaaaaaaaaaaaaaaa"',
    "api_key=xxxxxxxxxxxxxxxxxxxxxxxx",
    # hashes and ids
    "commit 3f2a9c1e5b7d4a6f8e0c2b4d6f8a0c2e4b6d8f0a",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "run 6f1c2a9e-4b7d-4c3a-9e8f-1a2b3c4d5e6f finished",
    "request id 0194b5e2-7c3d-7a4f-8e21-5d6c7b8a9f01",
    # paths and URLs
    "edited /home/u/src/api/internal/ledger_test.go and ./cmd/server/main.go",
    "see https://forge.example/acme/api/pull/42 and ssh://git@forge.example:2222/acme/api",
    "git@forge.example:acme/api.git",
    "https://docs.python.org/3/library/re.html#re.sub",
    # prose
    "The token is refreshed when it expires; pass the auth token via the header.",
    "Bearer tokens are described in RFC 6750. Use bearer authentication.",
    "The author: Jonathan Livingston Seagull",
    "secret: the tests now pass",
    "Fixed the password reset flow and rotated nothing.",
    "sk-learn is not a package; scikit-learn is.",
    "AKIA alone is just a prefix, AKIAshort too.",
    "Authorization header missing",
    "eyJ alone, eyJhbGciOi.short",
    "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----",
    "tab\tand newline\nkept",
    "unicode: naïve café — “quotes” 日本語",
    REDACTED,
    f"token = {REDACTED}",
    f"Authorization: Bearer {REDACTED}",
    f"https://{REDACTED}@forge.example/acme/api",
]


@pytest.mark.req6
@pytest.mark.parametrize("text", FALSE_POSITIVES)
def test_false_positives_survive_unchanged(text: str) -> None:
    assert redact(text) == text


@pytest.mark.req6
def test_control_characters_are_stripped_tab_and_newline_kept() -> None:
    text = "a\x00b\x07c\td\ne\x1bf\x7fg\x85h\x9fi\r\nj\x0bk\x0cl"
    # `ESC f` is an escape sequence (ESC and a final byte): it goes whole; CRLF is one LF.
    assert strip_control(text) == "abc\td\neghi\njkl"
    assert redact(text) == "abc\td\neghi\njkl"


@pytest.mark.req6
def test_control_characters_inside_a_token_cannot_hide_it() -> None:
    token = j("gh", "p_", R36[:10], "\x00\x1b", R36[10:])
    assert redact(f"t {token} e") == f"t {REDACTED} e"


@pytest.mark.req6
def test_redact_obj_redacts_nested_values_and_keeps_keys() -> None:
    token = j("gh", "p_", R36)
    episode = {
        "result_excerpt": f"used {token}",
        "files": [f"a.py {token}", ("b.py", f"Authorization: Bearer {R43}")],
        token: "key kept",
        "duration_ms": 1200,
        "ok": True,
        "none": None,
    }
    out = redact_obj(episode)
    assert out == {
        "result_excerpt": "used [REDACTED]",
        "files": ["a.py [REDACTED]", ("b.py", "Authorization: Bearer [REDACTED]")],
        token: "key kept",
        "duration_ms": 1200,
        "ok": True,
        "none": None,
    }
    assert episode["result_excerpt"] == f"used {token}"  # input not mutated


def test_shannon_entropy() -> None:
    assert shannon_entropy("") == 0.0
    assert shannon_entropy("aaaa") == 0.0
    assert shannon_entropy("abcd") == pytest.approx(2.0)
    assert shannon_entropy(R36) > 4.0


def test_rules_load_from_package_data_with_provenance() -> None:
    raw = resources.files("memactors.data").joinpath("redaction_rules.toml").read_bytes()
    meta = tomllib.loads(raw.decode())["meta"]
    assert meta["license"] == "MIT"
    assert meta["source"] == "gitleaks"
    assert meta["source_version"].startswith("v8") and meta["source_package"] == gitleaks_rules.DISTRIBUTION
    assert [r.id for r in load_rules()] == rule_ids()
    assert default.rules == Redactor().rules


def test_a_rule_that_matches_the_marker_is_refused() -> None:
    data = b"[[rules]]\nid = 'bad'\nregex = '''\\[REDACTED\\]'''\n"
    with pytest.raises(RulesError, match="marker"):
        load_rules(data, source="bad.toml")


@pytest.mark.parametrize(
    "data",
    [b"not toml [[[", b"[meta]\nx = 1\n", b"[[rules]]\nid = 'x'\nregex = '''(unclosed'''\n",
     b"[[rules]]\nregex = 'a'\n", b"[[rules]]\nid = 'x'\nregex = 'ab'\nentropy = 'high'\n"],
)
def test_invalid_rule_files_raise_rules_error(data: bytes) -> None:
    with pytest.raises(RulesError):
        load_rules(data, source="broken.toml")


def test_custom_rules_redactor() -> None:
    rules = load_rules(b"[[rules]]\nid = 'ticket'\nregex = '''TICKET-(?P<secret>[0-9]{4,})'''\n")
    assert Redactor(rules).redact("see TICKET-12345 now") == "see TICKET-[REDACTED] now"


# --- idempotence --------------------------------------------------------------------------------

SECRET_FRAGMENTS = [r[2] for r in TRUE_POSITIVES] + [r[1] for r in TRUE_POSITIVES] + [
    REDACTED, "[", "]", "REDACTED", "://", "@", ":", "=", " ", "\n", '"', "'", "ghp_", "AKIA", "Bearer ",
    "Authorization: ", "password=", "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----",
    "eyJ", ".", "\x00", "\x85",
]


@pytest.mark.req6
@settings(max_examples=300, deadline=None)
@given(st.text())
def test_redact_is_idempotent_over_arbitrary_text(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


@pytest.mark.req6
@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(SECRET_FRAGMENTS), st.text(max_size=12)), max_size=12))
def test_redact_is_idempotent_over_text_with_secrets(pieces: list[str]) -> None:
    text = "".join(pieces)
    once = redact(text)
    assert redact(once) == once


@pytest.mark.req6
@settings(max_examples=300, deadline=None)
@given(st.text(), st.sampled_from([j("gh", "p_", R36), j("AK", "IA", UPPER16), JWT, j("s", "k-", "ant-", "api03-", R93)]),
       st.text())
def test_a_fixed_prefix_token_never_survives_whatever_surrounds_it(left: str, token: str, right: str) -> None:
    out = redact(f"{left} {token} {right}")
    assert token not in out
    assert redact(out) == out


@pytest.mark.req6
def test_replacement_opening_a_word_boundary_still_converges() -> None:
    # ghp_ takes 36+ alnum, so the AKIA id glued after it is consumed; with a separator both go.
    glued = j("gh", "p_", R36, "-", "AK", "IA", UPPER16)
    once = redact(glued)
    assert once == f"{REDACTED}-{REDACTED}"
    assert redact(once) == once


@pytest.mark.req6
@pytest.mark.parametrize("text", list(ADVERSARIAL.values()), ids=list(ADVERSARIAL))
def test_adversarial_inputs_are_redacted_to_a_fixed_point(text: str) -> None:
    # Each input is ~200 kB; a rule that backtracks quadratically takes minutes on these (and the
    # suite's timeout says so). How long each takes is measured by bench/redact_adversarial.py, not here.
    once = redact(text)
    assert redact(once) == once


def test_a_lone_surrogate_is_stripped_not_a_crash() -> None:
    """A JSON string may carry "\\ud800" (half a UTF-16 pair): it is stripped like a control character,
    and the secret beside it is still redacted, alone and in a batch."""
    secret = j("ghp_", "a1B2" * 9)
    text = f"token {secret} \ud800 end"
    assert redact(text) == f"token {REDACTED}  end"
    assert redact_many([text, "plain \udfff"]) == [f"token {REDACTED}  end", "plain "]


def test_redact_tail_drops_an_orphan_key_end_and_its_material_and_nothing_else() -> None:
    material = "\n".join(j("MIIEow", "IBAAKCAQEA" * 5, str(n)) for n in range(3))
    end = "-----END RSA PRIVATE KEY-----"
    assert redact_tail(f"Exit code 1\n{material}\n{end}\nerror: bad flag\n") == \
        f"Exit code 1\n{REDACTED}\nerror: bad flag\n"
    # An END marker in prose, or after a BEGIN (a whole block: `redact` takes it), is not an orphan.
    assert redact_tail(f"the line {end} closes a key\n") == f"the line {end} closes a key\n"
    block = f"-----BEGIN RSA PRIVATE KEY-----\n{material}\n{end}"
    assert redact_tail(f"a\n{block}\nb") == redact(f"a\n{block}\nb") == f"a\n{REDACTED}\nb"
