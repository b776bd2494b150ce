"""The global document shuffle (`partition.shuffle: true`): scatter[input shard] then gather[output shard].

scatter reads an input shard and sends every record to the output shard that a seeded hash of its id
picks (of its file and line when it has no usable id), so documents with the same id meet in the same
shard, where the duplicate check sees them. gather concatenates what every scatter sent to one output
shard and orders it by a second seeded hash. Records travel unvalidated, with their original file and
line, so tokenize validates and rejects them exactly as it would unshuffled input. Nothing keeps the
input's order by source or length; the result depends on the seed and the documents, nothing else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import orjson

from tokenmill.config import TokenmillConfig
from tokenmill.core import layout
from tokenmill.core.commits import commit, committed
from tokenmill.core.hashing import unit_interval
from tokenmill.core.plan import Shard
from tokenmill.core.stats import Committed
from tokenmill.io.readers import Piece, ReadOptions, Record, records
from tokenmill.io.storage import Store


@dataclass(frozen=True)
class Shuffling:
    """What the scatter and gather stages use of a run, made once (`of`) and sent with their shards' Dask tasks."""

    store: Store  # the build
    input_key: str  # the input and partition config (`section_hash`), part of each scatter's stage key
    reading: ReadOptions  # how the input's records are read: bad ones travel on (tokenize applies the policy)
    seed: int  # partition.seed

    @classmethod
    def of(cls, config: TokenmillConfig) -> Shuffling:
        reading = dataclasses.replace(config.input.read_options(), on_invalid="quarantine")
        return cls(config.output.store(), config.section_hash("input", "partition"), reading, config.partition.seed)


@dataclass(frozen=True)
class Moved(Committed):
    """A scatter's or a gather's result for a shard: the records it moved and their bytes."""

    shard_id: int
    records: int
    bytes: int


def _routing_key(doc_id, problem, file: str, line: int) -> str:
    return str(doc_id) if doc_id is not None and not problem else f"{file}:{line}"


def _routing_keys(batch: list[Record]) -> list[str]:
    return [_routing_key(r.doc_id, r.problem, r.file, r.line) for r in batch]


def scatter_shard(run: Shuffling, shard: Shard, n_outputs: int) -> Moved:
    """Split one input shard into `n_outputs` bucket files, one per output shard (empty ones too)."""
    store, source = run.store, shard.shard_id
    key = f"{run.input_key}-{shard.source}-{n_outputs}"
    if (done := committed(store, "scatter", source, key)) is not None:
        return Moved.from_json(done, reused=True)
    buckets: list[list[bytes]] = [[] for _ in range(n_outputs)]
    batch: list[Record] = []
    count = size = 0

    def route(batch: list[Record]) -> None:
        targets = (unit_interval(_routing_keys(batch), f"shuffle:{run.seed}:") * n_outputs).astype(int)
        for record, target in zip(batch, targets, strict=True):
            buckets[target].append(record.to_json())

    for piece in shard.pieces:
        for record in records(piece, run.reading):
            batch.append(record)
            count += 1
            size += record.size
            if len(batch) >= 10_000:
                route(batch)
                batch = []
    route(batch)
    for target, lines in enumerate(buckets):
        store.write_bytes(layout.shuffle_bucket(source, target), b"".join(lines))
    moved = Moved(source, count, size)
    commit(store, "scatter", source, key, moved.to_json())
    return moved


def gather_shard(run: Shuffling, target: int, sources: list[int], plan_key: str) -> Moved:
    """Write output shard `target`: every source's bucket for it, in a seeded random order. Every output shard
    holds documents of every input shard: `plan_key` (the input as the plan saw it) keys it."""
    store, key = run.store, plan_key
    if (done := committed(store, "gather", target, key)) is not None:
        return Moved.from_json(done, reused=True)
    lines: list[bytes] = []
    for source in sources:
        rel = layout.shuffle_bucket(source, target)
        if not store.exists(rel):
            raise FileNotFoundError(f"{rel}: missing, although scatter of input shard {source} committed")
        lines += store.read_bytes(rel).splitlines(keepends=True)
    parsed = [orjson.loads(line) for line in lines]
    routing = [_routing_key(r["id"], r["problem"], r["file"], r["line"]) for r in parsed]
    # A stable sort on a hash of the id: records sharing an id stay together in input order, so the
    # duplicate check keeps the first one, as it would without the shuffle.
    order = np.argsort(unit_interval(routing, f"order:{run.seed}:"), kind="stable")
    store.write_bytes(layout.shuffled_shard(target), b"".join(lines[i] for i in order))
    size = sum(r["size"] for r in parsed)
    moved = Moved(target, len(lines), size)
    commit(store, "gather", target, key, moved.to_json())
    return moved


def shuffled_shards(config: TokenmillConfig, plan_key: str, gathered: list[Moved]) -> list[Shard]:
    """The shards tokenize reads after the shuffle (made from the whole input)."""
    store = config.output.store()
    return [
        Shard(
            g.shard_id,
            (Piece(store.url_of(layout.shuffled_shard(g.shard_id)), format="shuffled"),),
            g.bytes,
            source=f"{plan_key}-{g.shard_id}",
        )
        for g in gathered
    ]


def check_counts(scattered: list[Moved], gathered: list[Moved]) -> None:
    """Every record that was scattered was gathered exactly once."""
    sent, received = sum(s.records for s in scattered), sum(g.records for g in gathered)
    if sent != received:
        raise RuntimeError(f"shuffle lost or duplicated records: {sent} scattered, {received} gathered")
