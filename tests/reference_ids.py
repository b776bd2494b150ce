"""The reference ids of every corpus of tests/data under each tested tokenizer, recorded as digests.

HF `tokenizers` needs minutes of this machine's 2 cores for all of `tests/data/corpora` under the five
tokenizers, too long to repeat in every CI run; the sha256 of its ids (per corpus, and per block of
BLOCK documents to point at the documents that differ) is recorded once in `reference_ids.json` with the
`tokenizers` version and the sha256 of the tokenizer and corpus files. Tests compare against the record when
it matches the installed files and version, and against a live encoding otherwise.

Regenerate after changing a tokenizer, a corpus or `tokenizers`:  python -m tests.reference_ids
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import orjson
import tokenizers
from tokenizers import Tokenizer

from .conftest import CORPORA, EXAMPLES, TOKENIZERS

RECORD = Path(__file__).with_name("reference_ids.json")
TOKENIZER_NAMES = ["gpt2", "gpt-neox-20b", "phi3-mini", "deepseek-v3", "granite-3.1"]
# The text corpora (records with a `text` field): tests/data's and the examples' two web sets.
CORPUS_FILES = sorted([*CORPORA.rglob("*.jsonl.gz"), *EXAMPLES.glob("data/*.jsonl.gz")], key=lambda p: p.name)
BLOCK = 256  # documents per block digest


def corpus_texts(path: Path) -> list[str]:
    with gzip.open(path, "rb") as f:
        return [orjson.loads(line)["text"] for line in f if line.strip()]


def tokenizer_json(name: str) -> bytes:
    return (TOKENIZERS / name / "tokenizer.json").read_bytes()


def hf_ids(name: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The reference: `Tokenizer.encode_batch_fast(texts, add_special_tokens=False)` (encode's ids, all cores)."""
    encodings = Tokenizer.from_str(tokenizer_json(name).decode()).encode_batch_fast(texts, add_special_tokens=False)
    lengths = np.array([len(e.ids) for e in encodings], dtype=np.int64)
    flat = np.fromiter((t for e in encodings for t in e.ids), np.uint32, int(lengths.sum()))
    return flat, lengths


def digests(flat: np.ndarray, lengths: np.ndarray) -> dict:
    """sha256 of all ids and of each block of BLOCK documents (little-endian uint32 ids after int64 lengths)."""
    ends = np.cumsum(lengths)
    starts = ends - lengths

    def sha(first: int, last: int) -> str:
        h = hashlib.sha256(lengths[first:last].astype("<i8").tobytes())
        if last > first:
            h.update(flat[starts[first] : ends[last - 1]].astype("<u4").tobytes())
        return h.hexdigest()

    n = len(lengths)
    return {"all": sha(0, n), "blocks": [sha(i, min(i + BLOCK, n)) for i in range(0, n, BLOCK)]}


def key(name: str, corpus: Path) -> dict:
    """What the recorded digests depend on."""
    return {
        "tokenizers": tokenizers.__version__,
        "tokenizer_sha256": hashlib.sha256(tokenizer_json(name)).hexdigest(),
        "corpus_sha256": hashlib.sha256(corpus.read_bytes()).hexdigest(),
    }


def recorded(name: str, corpus: Path) -> dict | None:
    """The recorded digests for (tokenizer, corpus), or None where the record does not match the files here."""
    if not RECORD.exists():
        return None
    entry = json.loads(RECORD.read_text()).get(f"{name}/{corpus.name}")
    return entry if entry and entry["key"] == key(name, corpus) else None


def main() -> None:
    record = {}
    for name in TOKENIZER_NAMES:
        for corpus in CORPUS_FILES:
            record[f"{name}/{corpus.name}"] = {
                "key": key(name, corpus),
                **digests(*hf_ids(name, corpus_texts(corpus))),
            }
            print(f"{name} {corpus.name}", flush=True)
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORD}")


if __name__ == "__main__":
    main()
