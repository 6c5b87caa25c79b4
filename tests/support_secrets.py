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
