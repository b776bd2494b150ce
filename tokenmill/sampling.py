"""The sample stage: a deterministic, proportional sample of every shard, for training the tokenizer.

A document is in the sample when a seeded hash of its id falls below `sample_size / corpus bytes`,
so every shard, source and language contributes in proportion, whatever the shard count.
"""

from __future__ import annotations

import orjson

from tokenmill import layout
from tokenmill.commits import commit, committed
from tokenmill.config import TokenmillConfig
from tokenmill.hashing import unit_interval
from tokenmill.partition import shard_pieces
from tokenmill.readers import read_documents
from tokenmill.storage import Store

STAGE = "sample"


def sample_fraction(config: TokenmillConfig, plan: dict) -> float:
    total = sum(s["bytes"] for s in plan["shards"])
    return min(1.0, int(config.tokenizer.train.sample_size) / max(total, 1))


def sample_shard(config: TokenmillConfig, shard: dict, fraction: float) -> dict:
    """Write this shard's part of the sample to `_work/sample/`; return its path and size."""
    store, shard_id = Store(config.output.path), shard["shard_id"]
    key = f"{config.section_hash('input', 'partition')}-{fraction!r}-{config.tokenizer.train.seed}"
    if (done := committed(store, STAGE, shard_id, key)) is not None:
        return done
    lines, documents, nbytes = [], 0, 0
    salt = f"sample:{config.tokenizer.train.seed}:"
    for batch, _ in read_documents(shard_pieces(shard), config.input.text_field, config.input.id_field):
        keep = unit_interval(batch.ids, salt) < fraction
        for text, chosen in zip(batch.texts, keep, strict=True):
            if chosen:
                line = orjson.dumps(text) + b"\n"
                lines.append(line)
                nbytes += len(line)
                documents += 1
    rel = layout.sample_file(shard_id)
    store.write_bytes(rel, b"".join(lines))
    return commit(store, STAGE, shard_id, key, {"path": rel, "documents": documents, "bytes": nbytes})
