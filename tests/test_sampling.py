"""The sample stage: proportional, deterministic, held-out part disjoint, stratification tops up rare groups."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from tokenmill import sampling
from tokenmill.config import TokenmillConfig
from tokenmill.partition import plan_shards

from .conftest import CORPORA, read_jsonl

INPUTS = [str(CORPORA / "multilingual" / "*.jsonl.gz"), str(CORPORA / "enwiki_slice" / "*.jsonl.gz")]


def make_config(out, sample_size="1MB", holdout_size="500KB", **train) -> TokenmillConfig:
    return TokenmillConfig.model_validate({
        "name": "sample-test",
        "input": {"paths": INPUTS, "id_field": "id"},
        "partition": {"shard_size": "8MB"},
        "tokenizer": {"train": {"sample_size": sample_size, "vocab_size": 1000, **train}},
        "fertility": {"holdout_size": holdout_size, "group_by": ["source"]},
        "output": {"path": str(out)},
    })  # fmt: skip


def run_sample(config: TokenmillConfig) -> list[dict]:
    """The sample stage as the flow runs it, one shard at a time (the flow maps it over Dask workers)."""
    plan = plan_shards(config)
    f, g = sampling.fractions(config, plan)
    return [sampling.sample_shard(config, shard, f, g) for shard in plan["shards"]]


@pytest.fixture(scope="module")
def corpus_bytes_by_source() -> Counter:
    sizes = Counter()
    for path in sorted(CORPORA.glob("multilingual/*.jsonl.gz")) + sorted(CORPORA.glob("enwiki_slice/*.jsonl.gz")):
        for doc in read_jsonl(path):
            sizes[doc["source"]] += len(doc["text"].encode())
    return sizes


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    config = make_config(tmp_path_factory.mktemp("sample"))
    return config, run_sample(config)


def test_sample_is_about_the_configured_size_and_comes_from_every_shard(sampled):
    config, samples = sampled
    assert len(samples) >= 3  # compressed files are whole shards; the small ones share one
    assert all(s["documents"] > 0 for s in samples)
    total = sum(s["bytes"] for s in samples)
    # sample_size counts input bytes (JSON included), so the text is a little less; never far off
    assert 0.7e6 < total < 1.1e6, total
    assert sum(len(t.encode()) for t in sampling.training_texts(config, samples)) == total


def test_sample_mirrors_the_corpus_by_source(sampled, corpus_bytes_by_source):
    config, samples = sampled
    records = [orjson.loads(line) for s in samples for line in open(f"{config.output.path}/{s['path']}", "rb")]
    sampled_bytes = Counter()
    for r in records:
        sampled_bytes[r["source"]] += len(r["text"].encode())
    corpus_total, sample_total = sum(corpus_bytes_by_source.values()), sum(sampled_bytes.values())
    english = "wikipedia-en"
    assert abs(sampled_bytes[english] / sample_total - corpus_bytes_by_source[english] / corpus_total) < 0.05


def test_holdout_is_disjoint_from_the_training_sample(sampled):
    config, samples = sampled
    train = set(sampling.training_texts(config, samples))
    held = [r["text"] for r in sampling.holdout_records(config, samples)]
    assert len(held) > 50 and not train & set(held)
    assert all("source" in r for r in sampling.holdout_records(config, samples))


def test_same_seed_gives_the_same_sample_and_another_seed_another(tmp_path, sampled):
    config, samples = sampled
    again = make_config(tmp_path / "again")
    other = make_config(tmp_path / "other", seed=1)
    assert list(sampling.training_texts(again, run_sample(again))) == list(sampling.training_texts(config, samples))
    assert list(sampling.training_texts(other, run_sample(other))) != list(sampling.training_texts(config, samples))


def test_stratification_represents_a_group_the_proportional_sample_misses(tmp_path):
    # The Japanese novel is one document of 1.1 MB in 68 MB: a 300 KB proportional sample takes it with
    # probability ~0.5%; stratified by source, every source gets at least min_group_size.
    novel = "aozora-bunko via google/sentencepiece data/"
    plain = make_config(tmp_path / "plain", sample_size="300KB")
    stratified = make_config(tmp_path / "strat", sample_size="300KB", stratify_by="source", min_group_size="64KB")
    plain_texts = list(sampling.training_texts(plain, run_sample(plain)))
    samples = run_sample(stratified)
    texts = list(sampling.training_texts(stratified, samples))
    novel_text = read_jsonl(next(CORPORA.glob("multilingual/aozora*.jsonl.gz")))[0]["text"]
    assert novel_text not in plain_texts and novel_text in texts
    sizes = sampling.group_sizes(samples)
    assert set(sizes) == {novel, "udhr (nltk_data udhr2)", "xquad", "wikipedia-en"}
    assert sizes["wikipedia-en"]["sample_bytes"] > 0.6 * sum(s["sample_bytes"] for s in sizes.values())
    # every other group keeps its proportional sample; the tops-ups only add
    assert set(plain_texts) <= set(texts)
