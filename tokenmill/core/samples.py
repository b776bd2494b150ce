"""The sample files, as the sample stage writes them (JSON lines per shard: the training sample, its reserve for
stratified top-ups, the held-out sample) and as the tokenizer's training and the fertility report read them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import orjson

from tokenmill.config import TokenmillConfig
from tokenmill.core import layout
from tokenmill.core.hashing import unit_interval
from tokenmill.core.shares import sample_shares
from tokenmill.core.stats import Committed
from tokenmill.io.storage import Store

NO_VALUE = "(none)"  # the group of a document that lacks the field


MIX_SALT = "mix-sample:"  # the hashes of sampled texts that trim a mixture's sources to their shares


@dataclass(frozen=True)
class Sampled(Committed):
    """The sample stage's result for a shard: its sample files and what they hold."""

    shard_id: int
    path: str  # the training sample
    holdout: str  # the held-out sample
    documents: int = 0  # in the training sample
    bytes: int = 0
    holdout_documents: int = 0
    holdout_bytes: int = 0
    bytes_read: int = 0
    mix_source: str | None = None  # in a mixture, the shard's source and its input bytes (for `mix_thresholds`)
    input_bytes: int = 0
    reserve: str | None = None  # stratified: the reserve's file, and each group's bytes in the shard and its sample
    groups: dict[str, dict[str, int]] = field(default_factory=dict)


def group_name(value) -> str:
    return NO_VALUE if value is None else str(value)


def top_up_thresholds(store: Store, samples: list[Sampled], min_group_size: int) -> dict[str, float]:
    """Per group short of `min_group_size`: the hash up to which its reserve documents are added."""
    short = {g: min_group_size - s["sample_bytes"] for g, s in group_sizes(samples).items()}
    short = {g: need for g, need in short.items() if need > 0}
    candidates: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for s in samples:
        with store.open(s.reserve) as f:
            for line in f:
                r = orjson.loads(line)
                if r["group"] in short:
                    candidates[r["group"]].append((r["h"], r["bytes"]))
    thresholds = {}
    for group, docs in candidates.items():
        taken = 0
        for h, nbytes in sorted(docs):
            thresholds[group], taken = h, taken + nbytes
            if taken >= short[group]:
                break
    return thresholds


def training_files(samples: list[Sampled]) -> list[str]:
    """The files the training sample is read from (their hashes identify the sample)."""
    return [s.path for s in samples] + [s.reserve for s in samples if s.reserve]


def training_texts(config: TokenmillConfig, samples: list[Sampled]) -> Iterator[str]:
    """The training sample's texts: shard by shard, then the stratification top-ups, in a fixed order. A mixture's
    sources in their shares of the mix, in text bytes (`mix_thresholds`)."""
    store = config.output.store()
    thresholds = mix_thresholds(config, samples)
    for s, texts in zip(samples, sample_texts(config, samples), strict=True):
        if (threshold := thresholds.get(s.mix_source)) is not None:
            texts = [t for t, h in zip(texts, unit_interval(texts, MIX_SALT), strict=True) if h < threshold]
        yield from texts
    if not any(s.reserve for s in samples):
        return
    thresholds = top_up_thresholds(store, samples, int(config.tokenizer.train.min_group_size))
    for s in samples:
        with store.open(s.reserve) as f:
            for line in f:
                r = orjson.loads(line)
                if r["h"] <= thresholds.get(r["group"], -1.0):
                    yield r["text"]


def mix_thresholds(config: TokenmillConfig, samples: list[Sampled]) -> dict[str, float]:
    """For a mixture, each source's hash threshold (over `MIX_SALT` hashes of its sampled texts) below which its
    texts make its share of `sample_size` in text bytes, to within one document: its sample (drawn with a margin
    by `fractions`) is trimmed in hash order. A source whose sample falls short keeps all of it."""
    if not config.mixture or config.tokenizer.train is None:
        return {}
    source_bytes = dict.fromkeys(config.inputs(), 0)
    for s in samples:
        source_bytes[s.mix_source] += s.input_bytes
    shares, size = sample_shares(config, source_bytes), int(config.tokenizer.train.sample_size)
    hashed: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for s, texts in zip(samples, sample_texts(config, samples), strict=True):
        sizes = [len(t.encode()) for t in texts]
        hashed[s.mix_source] += zip(unit_interval(texts, MIX_SALT).tolist(), sizes, strict=True)
    thresholds = {}
    for name, pairs in hashed.items():
        pairs.sort()
        total = np.cumsum([n for _, n in pairs])
        kept = int(np.searchsorted(total, shares[name] * size))  # the texts before it make the share
        thresholds[name] = pairs[kept][0] if kept < len(pairs) else 1.0
    return thresholds


def sample_texts(config: TokenmillConfig, samples: list[Sampled]) -> Iterator[list[str]]:
    """Each shard's training sample's texts, shard by shard."""
    store = config.output.store()
    for s in samples:  # each read whole: one request on an object store (opening it asks its size, a HEAD)
        yield [orjson.loads(line)["text"] for line in store.read_bytes(s.path).splitlines()]


def holdout_records(config: TokenmillConfig, samples: Iterable[Sampled | int]) -> Iterator[dict]:
    """The held-out documents, `{"text": ..., <group_by fields>...}`, shard by shard: of the sample stage's
    results, or of the shards whose ids are given (their held-out files are named by them)."""
    store = config.output.store()
    for s in samples:  # a shard's part of `fertility.holdout_size`, read whole (one request on an object store)
        rel = s.holdout if isinstance(s, Sampled) else layout.holdout_file(int(s))
        yield from map(orjson.loads, store.read_bytes(rel).splitlines())


def group_sizes(samples: list[Sampled]) -> dict[str, dict[str, int]]:
    """Per stratification group: its bytes in the corpus and in the proportional sample, over all shards."""
    total: dict[str, dict[str, int]] = defaultdict(lambda: {"bytes": 0, "sample_bytes": 0})
    for s in samples:
        for group, sizes in s.groups.items():
            for k, v in sizes.items():
                total[group][k] += v
    return dict(sorted(total.items()))
