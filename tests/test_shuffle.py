"""The global document shuffle: a permutation of the input, deterministic per seed, with no order left."""

from __future__ import annotations

import json

import numpy as np

from tokenmill.config import TokenmillConfig
from tokenmill.io.readers import read_documents
from tokenmill.stages.partition import plan_shards
from tokenmill.stages.shuffle_documents import (
    Moved,
    Shuffling,
    check_counts,
    gather_shard,
    scatter_shard,
    shuffled_shards,
)


def length_sorted_corpus(tmp_path, n_files=4, per_file=400) -> list[str]:
    """Documents sorted longest first across files, as OpenGenome2's inputs are."""
    lengths = sorted(np.random.default_rng(0).integers(10, 3000, n_files * per_file), reverse=True)
    ids = []
    for f in range(n_files):
        with open(tmp_path / f"part-{f}.jsonl", "w") as out:
            for i in range(per_file):
                doc_id = f"doc-{f}-{i}"
                ids.append(doc_id)
                out.write(json.dumps({"id": doc_id, "text": "x" * int(lengths[f * per_file + i])}) + "\n")
    return ids


def run_shuffle(tmp_path, seed: int, out: str):
    config = TokenmillConfig.model_validate(
        {
            "name": "s",
            "input": {"paths": [str(tmp_path / "part-*.jsonl")], "id_field": "id"},
            "partition": {"shard_size": 150_000, "shuffle": True, "seed": seed},
            "tokenizer": {"path": "unused.json"},
            "output": {"path": str(tmp_path / out)},
        }
    )
    plan = plan_shards(config)
    n = plan.shuffled_shards
    run = Shuffling.of(config)
    scattered = [scatter_shard(run, s, n) for s in plan.shards]
    sources = [s.shard_id for s in plan.shards]
    gathered = [gather_shard(run, t, sources, plan.key) for t in range(n)]
    check_counts(scattered, gathered)
    shards = shuffled_shards(config, plan.key, gathered)
    docs = [
        [
            (i, len(t))
            for batch, _ in read_documents(s.pieces, config.input.read_options())
            for i, t in zip(batch.ids, batch.texts, strict=True)
        ]
        for s in shards
    ]
    return plan, docs, [(tmp_path / out / "_work/shuffle" / f"shard-{t:05d}.jsonl").read_bytes() for t in range(n)]


def test_shuffle_is_a_permutation_with_no_length_trend(tmp_path):
    ids = length_sorted_corpus(tmp_path)
    plan, docs, _ = run_shuffle(tmp_path, seed=0, out="a")
    flat = [d for shard in docs for d in shard]
    assert sorted(i for i, _ in flat) == sorted(ids) and len(flat) == len(ids)  # nothing lost or duplicated
    assert [i for i, _ in flat] != ids
    means = [np.mean([n for _, n in shard]) for shard in docs]
    assert len(means) >= 8
    assert max(means) / min(means) < 1.35  # the input's shards go from ~2900 to ~100 characters on average
    trend = np.corrcoef(np.arange(len(means)), means)[0, 1]
    assert abs(trend) < 0.7


def test_same_seed_same_bytes_other_seed_other_order(tmp_path):
    length_sorted_corpus(tmp_path)
    _, docs_a, files_a = run_shuffle(tmp_path, seed=1, out="a")
    _, docs_b, files_b = run_shuffle(tmp_path, seed=1, out="b")
    _, docs_c, _ = run_shuffle(tmp_path, seed=2, out="c")
    assert files_a == files_b
    assert docs_a != docs_c
    assert sorted(d for s in docs_a for d in s) == sorted(d for s in docs_c for d in s)


def test_bad_records_travel_and_are_rejected_naming_their_original_line(tmp_path):
    length_sorted_corpus(tmp_path, n_files=1, per_file=50)
    with open(tmp_path / "part-0.jsonl", "a") as f:
        f.write('{"id": "broken", "text": \n')
        f.write('{"id": "doc-0-3", "text": "a duplicate id from elsewhere"}\n')
    _, _, _ = run_shuffle(tmp_path, seed=0, out="a")
    config = TokenmillConfig.model_validate(
        {
            "name": "s",
            "input": {"paths": [str(tmp_path / "part-*.jsonl")], "id_field": "id"},
            "partition": {"shard_size": 150_000, "shuffle": True},
            "tokenizer": {"path": "unused.json"},
            "output": {"path": str(tmp_path / "a")},
        }
    )
    plan = plan_shards(config)
    gathered = [Moved(t, records=0, bytes=0) for t in range(plan.shuffled_shards)]
    rejects = [
        r.to_dict()
        for s in shuffled_shards(config, plan.key, gathered)
        for _, bad in read_documents(s.pieces, config.input.read_options())
        for r in bad
    ]
    assert sorted((r["file"], r["line"], r["reason"][:14]) for r in rejects) == [
        ("part-0.jsonl", 51, "malformed JSON"),
        ("part-0.jsonl", 52, "duplicate id i"),
    ]
