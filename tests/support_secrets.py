"""The secret corpus of tests/data/secret_corpus.json: realistic credential formats, each built at run time
from its shape (prefix, alphabet, length) with a generator seeded by its id, so the values are the same on
every run and no whole credential is written in this repository."""

from __future__ import annotations

import json
import random
import re
from functools import cache
from pathlib import Path

import attrs

CORPUS = Path(__file__).parent / "data" / "secret_corpus.json"

ALPHABETS = {
    "alnum": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
    "upper_alnum": "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    "digit": "0123456789",
    "hex": "0123456789abcdef",
    "HEX": "0123456789ABCDEF",
    "b64": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
    "b64url": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-",
    "bech32": "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L",
    "pw": "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789!#%*+-=?^_",
    "urlpw": "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789-._~",
}


@attrs.frozen
class Sample:
    id: str
    what: str
    before: str
    secret: str
    after: str
    #: The random parts of the secret (8+ characters): none may appear anywhere, in any case.
    random_parts: tuple[str, ...]

    @property
    def text(self) -> str:
        return self.before + self.secret + self.after

    @property
    def one_line(self) -> str:
        """The sample as a one-line field holds it (line breaks refused): whitespace runs as one space."""
        return " ".join(self.text.split())

    def telltales(self) -> set[str]:
        """What must not appear: each random part raw, lower-cased and JSON-escaped, and its runs of 12+
        letters and digits (what an FTS index would keep of it)."""
        out: set[str] = set()
        for part in self.random_parts:
            out |= {part, part.lower(), json.dumps(part)[1:-1]}
            out |= {run for run in re.findall(r"[A-Za-z0-9]{12,}", part)}
            out |= {run.lower() for run in re.findall(r"[A-Za-z0-9]{12,}", part)}
        return {t for t in out if len(t) >= 8}

    def found_in(self, data: str | bytes) -> list[str]:
        if isinstance(data, bytes):
            return [t for t in self.telltales() if t.encode() in data]
        return [t for t in self.telltales() if t in data]


def _build(spec: dict[str, object]) -> Sample:
    rng = random.Random(f"secret-corpus/{spec['id']}")
    secret, parts = [], []
    for segment in spec["secret"]:  # type: ignore[attr-defined]
        if isinstance(segment, str):
            secret.append(segment)
            continue
        alphabet, length = ALPHABETS[segment[0]], int(segment[1])
        value = "".join(rng.choice(alphabet) for _ in range(length))
        secret.append(value)
        if length >= 8 and segment[2:] != ["public"]:  # ["digit", 19, "public"]: an id, not the credential
            parts.append(value)
    return Sample(id=str(spec["id"]), what=str(spec["what"]), before=str(spec["before"]), secret="".join(secret),
                  after=str(spec["after"]), random_parts=tuple(parts))


@cache
def corpus() -> tuple[Sample, ...]:
    return tuple(_build(spec) for spec in json.loads(CORPUS.read_text(encoding="utf-8"))["formats"])


def j(*parts: str) -> str:
    """Join pieces; keeps whole tokens out of the source text."""
    return "".join(parts)


R36 = "Idg53Z131ckMzKyTs2mP" + "Ln6YYc8kkswFm9il"


R36B = "VcryiPIQEfJbxv71RDCP" + "0MWWC0orNsfiieon"


R82 = "rbv4lc9lR7zXlOW1UYAXJM7eYZmdzeJGcviUgCqW" + "hw09GGyX1zyNsgyTSf64b8vq2aLhLrDTZMJV7Sw0ax"


R40 = "eeOoWkkWURpI2aQAvgYq" + "nSX3Ua28ELNwRlvqL03y"


R48 = "RFkVAL7AjDx8WHnk7pBiSGmW" + "FThEQF4ENx9EpemIGiZEd4UH"


R60 = "Cf44TKOvWd0W3aP7EpG0jKSQww6SOC" + "XarYKsD1hLzMZVEWRhkwue5EFnywNc"


R93 = "6AaqHoff60R1cTgeXxzLI6I6oloKlQsnYcsYq0bXOiL6Bb" + "QQf5wRRgrrFRseaVQ1vSOUDORb5W0WFkfJ1v3r2GW6hZvPq"


R20 = "e5EXRPvOAS" + "onf0aancRX"


R32 = "63BOHhbRv1uScBxw" + "S38IWJ654E9Vnc8O"


R43 = "njLVJU8A6TS8DzYkSXS5y" + "Kp8PQ1Qz7YX6LihEewBBF0"


UPPER16 = "JHCFBH2S" + "H4FWEI22"


PEM_BODY = "MIIEowIBAAKCAQEA" + R60 + "\n" + R48 + "\n"


JWT = j("ey", "JhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9", ".", "ey", "JzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ",
        ".", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")


# (rule id, text before, secret, text after): the secret alone must become [REDACTED].
TRUE_POSITIVES: list[tuple[str, str, str, str]] = [
    ("github-pat", "pushed with ", j("gh", "p_", R36), " ok"),
    ("github-pat", "GITHUB_TOKEN=", j("gh", "o_", R36B), "\n"),
    ("github-pat", "app token ", j("gh", "u_", R36), ""),
    ("github-pat", "install token: '", j("gh", "s_", R36B), "'"),
    ("github-pat", "refresh=", j("gh", "r_", R36), ";"),
    ("github-fine-grained-pat", "export GH_PAT=", j("github", "_pat_", R82[:22], "_", R82[23:]), " # fine"),
    ("gitlab-pat", "token ", j("gl", "pat-", R20), " used"),
    ("aws-access-key-id", "key id ", j("AK", "IA", UPPER16), " in us-east-1"),
    ("aws-access-key-id", "sts gave ", j("AS", "IA", UPPER16), "."),
    ("aws-access-key-id", "", j("AB", "IA", UPPER16), ""),
    ("aws-access-key-id", "x ", j("AC", "CA", UPPER16), " y"),
    ("aws-secret-access-key", "aws_secret_access_key = ", R40[:20] + "/" + R40[21:], "\n"),
    ("aws-secret-access-key", 'AWS_SECRET_ACCESS_KEY="', R40, '"'),
    ("slack-token", "bot ", j("xo", "xb-", "1234567890123-1234567890123-", R20), " posted"),
    ("slack-token", "user ", j("xo", "xp-", "1234567890-1234567890-1234567890-", R32), ""),
    ("slack-token", "", j("xo", "xa-", "2-", R20), ""),
    ("slack-token", "r=", j("xo", "xr-", R32), ""),
    ("slack-token", "legacy ", j("xo", "xs-", "12345-67890-", R20), ""),
    ("slack-token", "app ", j("xa", "pp-", "1-A0123456789-1234567890123-", R32.lower()), " end"),
    ("slack-webhook-url", "POST https://hooks.slack.com/services/", j("T0", "1ABCDEF/B02GHIJKL/", R20), " done"),
    ("openai-api-key", "OPENAI_API_KEY=", j("s", "k-", R48), "\n"),
    ("openai-api-key", "using ", j("s", "k-", "proj-", R60, R48), " for the call"),
    ("anthropic-api-key", "ANTHROPIC_API_KEY=", j("s", "k-", "ant-", "api03-", R93, "AA"), "\n"),
    ("anthropic-api-key", "admin ", j("s", "k-", "ant-", "admin01-", R93, "AA"), " revoked"),
    ("jwt", "session cookie ", JWT, " expired"),
    ("private-key", "key:\n", j("-----BEGIN RSA ", "PRIVATE KEY-----\n", PEM_BODY, "-----END RSA ", "PRIVATE KEY-----"),
     "\nafter the key"),
    ("private-key", "", j("-----BEGIN ", "PRIVATE KEY-----\n", PEM_BODY, "-----END ", "PRIVATE KEY-----"), ""),
    ("private-key", "cat id_ed25519\n", j("-----BEGIN OPENSSH ", "PRIVATE KEY-----\n", PEM_BODY,
                                          "-----END OPENSSH ", "PRIVATE KEY-----"), "\n$ "),
    ("url-userinfo-password", "cloning https://", "alice:s3cr3t-pw", "@forge.example/acme/api.git ..."),
    ("url-userinfo-password", "DATABASE_URL=postgres://", j("app:", R20), "@db.internal:5432/ledger"),
    ("url-userinfo-password", "remote https://", j("x-access-token:", "gh", "s_", R36), "@github.com/acme/api"),
    ("url-userinfo-token", "git clone https://", R32, "@forge.example/acme/api"),
    ("authorization-header", "Authorization: Bearer ", R43, "\n"),
    ("authorization-header", "curl -H 'Authorization: Basic ", "YWxpY2U6czNjcjN0LXB3", "' https://x"),
    ("authorization-header", '{"authorization": "token ', R32, '"}'),
    ("authorization-header", "Authorization: Bearer ", "short", ""),
    ("bearer-token", "sent Bearer ", R43, " to the api"),
    ("generic-secret-assignment", "password = ", R20, "\n"),
    ("generic-secret-assignment", "DB_PASSWD=", R32, " ./run"),
    ("generic-secret-assignment", "client_secret: ", R43, "\n"),
    ("generic-secret-assignment", "--api-key=", R32, " --verbose"),
    ("generic-secret-quoted", '{"api_key": "', R32, '", "n": 1}'),
    ("generic-secret-quoted", "db_password: '", "Xk9#mP2$vL8qR4nT", "'"),
    ("generic-secret-quoted", 'const accessKey = "', R20, '";'),
    ("generic-secret-quoted", "private_key = `", R43, "`"),
    ("generic-secret-assignment", "auth_token => ", R32, ","),
    ("generic-secret-quoted", 'credentials: "', R43, '"'),
    ("generic-secret-quoted", 'password = "', "CorrectHorseBatteryStaple", '"'),
    ("private-key", '{"key": "', j("-----BEGIN RSA ", "PRIVATE KEY-----\\n", R60, "\\n", "-----END RSA ",
                                   "PRIVATE KEY-----"), '"}'),
    # formats once missed, caught by the gitleaks-derived rules and the password rules
    ("stripe-access-token", "STRIPE_KEY=", j("sk", "_live_", R32), "\n"),
    ("stripe-access-token", "restricted key ", j("rk", "_live_", R36), ". Rotated."),
    ("stripe-access-token", "paid with ", j("sk", "_live_", R20), ""),
    ("gcp-api-key", "maps key ", j("AI", "za", "Sy", R32, "-"), " in the page"),
    ("npm-access-token", "//registry/:_authToken=", j("np", "m_", R36), "\n"),
    ("pypi-upload-token", "password = ", j("py", "pi-", "AgEIcHlwaS5vcmc", R60), "\n"),
    ("sendgrid-api-token", "SENDGRID_API_KEY=", j("S", "G.", R20, "AB", ".", R43), "\n"),
    ("vault-service-token", "VAULT_TOKEN=", j("hv", "s.", R93), " vault kv get"),
    ("docker-pat", "docker login -p ", j("dck", "r_pat_", R20, "abcdefg"), " -u ci"),
    ("password-assignment", "password=", "hunter2", " ./run"),
    ("password-assignment", "PGPASSWORD: ", "s3cret!", "\n"),
    ("password-quoted", '{"password": "', "hunter2", '"}'),
    ("password-quoted", "db_passwd = '", "secret", "'"),
    ("url-userinfo-password", "DATABASE_URL=postgres://", "app:p@ss@w0rd", "@db.internal:5432/ledger"),
    # formats gitleaks lacks or takes only with the vendor's name before them
    ("azure-storage-account-key", "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=",
     R60 + R48[:26] + "==", ";EndpointSuffix=core.windows.net"),
    ("azure-sas-signature", "curl 'https://acme.blob.core.windows.net/c/db.bak?sv=2022-11-02&sp=r&sig=",
     R43[:30] + "%3D", "' -o db.bak"),
    ("vault-batch-token-short", "X-Vault-Token: ", j("hv", "b.", "AAAAAQ", R60), "\n"),
    ("huggingface-token", "huggingface-cli login --token ", j("h", "f_", R32, "x9"), "\n"),
    ("datadog-key", "docker run -e DD_APP_KEY=", R40, " agent"),
    ("mailgun-api-key", "sent with ", j("ke", "y-", "3f2a9c1e5b7d4a6f8e0c2b4d6f8a0c2e"), " today"),
    ("newrelic-key", "license ", j("3f2a9c1e5b7d4a6f8e0c2b4d6f8a0c2e", "FFFF", "NRAL"), "."),
    ("newrelic-key", "user key ", j("NR", "AK-", UPPER16, "ABCDEFGHIJK"), " rotated"),
    ("telegram-bot-token", "POST https://api.telegram.org/bot", j("1234567890", ":A", "A", R32, "x"), "/sendMessage"),
    ("discord-webhook-url", "https://discord.com/api/webhooks/987065432109876543/", R60 + "abcdefgh", ""),
    ("discord-bot-token", "discord bot token: ", j("M", R20, "abc", ".", "GhIjKl", ".", R36[:30]), "\n"),
    ("atlassian-api-token-any-context", "jira token ", j("ATA", "TT3xFfGF0", R93, R60, "=", "ABCDEF12"), " ok"),
    ("mapbox-secret-token", "token ", j("s", "k.eyJ1IjoiYWNtZSIsImEiOiJ", R20, ".", R20), " ok"),
    ("okta-ssws-token", "Authorization: SSWS ", "00" + R40, "\n"),
    ("netrc-password", "machine api.acme.dev login ci password ", "hunter2-Xk9", "\n"),
]


#: Inputs built to make a regular expression backtrack: each must be redacted in linear time (tests/redact,
#: bench/redact_adversarial.py).
ADVERSARIAL = {
    "letters": "a" * 200_000,
    "keys": "token=" * 40_000,
    "unterminated-values": ("token=" * 20 + "(") * 2_000,
    "jwt-heads": "-eyJ" * 50_000,
    "schemes": "://" * 60_000,
    "userinfo": "://a:" * 40_000,
    "sk-heads": "-sk-" * 50_000,
    "quoted": "token='" + "tokn:'" * 30_000,
    "begins": "-----BEGIN RSA PRIVATE KEY-----" * 5_000,
    "begin-end": "-----BEGIN PRIVATE KEY-----x-----END RSA" * 5_000,
    "headers": "Authorization: Bearer " * 10_000,
    "bearers": "bearer " * 30_000,
    "aws": "AKIA" * 50_000,
    "separators": ("token" + " " * 5 + "=" + " " * 5) * 12_000,
    # memactors' own rules: the literal each starts at, repeated, and long runs where a quantifier could rescan
    "netrc": "machine h login u " * 11_000 + "machine" + " " * 20_000,
    "telegram": ("1234567890:A" + "b" * 20) * 6_000,
    "sig-params": "&sig=" * 40_000,
    "account-keys": "AccountKey=" * 18_000,
    "discord": "discord bot token " * 11_000,
    "key-dashes": "key-" * 50_000,
}
