"""The sample stage: proportional, deterministic, held-out part disjoint, stratification tops up rare groups;
on plain JSONL it reads a few percent of the corpus, the same whatever the shards."""

from __future__ import annotations

import gzip
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest

from tokenmill.config import TokenmillConfig
from tokenmill.core import samples as sample_files
from tokenmill.stages import sampling
from tokenmill.stages.partition import plan_shards

from .conftest import CORPORA, TOKENIZERS, read_jsonl

ENWIKI_COPIES = 4  # the repository's 8,000 articles, 4 times: the 54 MB of English these tests are sized for


def write_enwiki(path: Path, opener=open) -> Path:
    """enwiki_slice written ENWIKI_COPIES times, each copy's ids and texts marked apart (` [k]` after the text): a
    corpus of many distinct documents (the sample and the held-out part are told apart by their texts)."""
    articles = read_jsonl(CORPORA / "enwiki_slice" / "enwiki_slice.jsonl.gz")
    with opener(path, "wb") as f:
        for k in range(ENWIKI_COPIES):
            copy = ({**d, "id": f"{d['id']}-{k}", "text": f"{d['text']} [{k}]"} if k else d for d in articles)
            f.writelines(orjson.dumps(d) + b"\n" for d in copy)
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    """The multilingual corpora (10.6 MB: XQuAD, the UDHR and a Japanese novel) and the English one (54 MB), in one
    directory: a file's name is its path under it, which places its sampled blocks, the same wherever it lies (with
    the checkout's files and a temporary one, the names held the checkout's path, and the sample changed with it)."""
    corpora = tmp_path_factory.mktemp("corpora")
    shutil.copytree(CORPORA / "multilingual", corpora / "multilingual")
    write_enwiki(corpora / "enwiki.jsonl.gz", lambda path, mode: gzip.open(path, mode, compresslevel=1))
    return [str(corpora / "multilingual" / "*.jsonl.gz"), str(corpora / "enwiki.jsonl.gz")]


def make_config(out, inputs: list[str], sample_size="1MB", holdout_size="500KB", **train) -> TokenmillConfig:
    return TokenmillConfig.model_validate({
        "name": "sample-test",
        "input": {"paths": inputs, "id_field": "id"},
        "partition": {"shard_size": "8MB"},
        "tokenizer": {"train": {"sample_size": sample_size, "vocab_size": 1000, **train}},
        "fertility": {"holdout_size": holdout_size, "group_by": ["source"]},
        "output": {"path": str(out)},
    })  # fmt: skip


def run_sample(config: TokenmillConfig) -> list[dict]:
    """The sample stage as the flow runs it, one shard at a time (the flow maps it over Dask workers)."""
    plan = plan_shards(config)
    f, g = sampling.fractions(config, plan)
    return [sampling.sample_shard(sampling.Sampling.of(config, f, g), shard) for shard in plan.shards]


@pytest.fixture(scope="module")
def corpus_bytes_by_source(inputs) -> Counter:
    sizes = Counter()
    for path in sorted(CORPORA.glob("multilingual/*.jsonl.gz")) + [Path(inputs[1])]:
        for doc in read_jsonl(path):
            sizes[doc["source"]] += len(doc["text"].encode())
    return sizes


@pytest.fixture(scope="module")
def sampled(tmp_path_factory, inputs):
    config = make_config(tmp_path_factory.mktemp("sample"), inputs)
    return config, run_sample(config)


def test_sample_is_about_the_configured_size_and_comes_from_every_shard(sampled):
    config, samples = sampled
    assert len(samples) >= 3  # compressed files are whole shards; the small ones share one
    assert all(s.documents > 0 for s in samples)
    total = sum(s.bytes for s in samples)
    # sample_size counts input bytes (JSON included), so the text is a little less; never far off
    assert 0.7e6 < total < 1.1e6, total
    assert sum(len(t.encode()) for t in sample_files.training_texts(config, samples)) == total


def test_sample_mirrors_the_corpus_by_source(sampled, corpus_bytes_by_source):
    config, samples = sampled
    records = [orjson.loads(line) for s in samples for line in open(f"{config.output.path}/{s.path}", "rb")]
    sampled_bytes = Counter()
    for r in records:
        sampled_bytes[r["source"]] += len(r["text"].encode())
    corpus_total, sample_total = sum(corpus_bytes_by_source.values()), sum(sampled_bytes.values())
    english = "wikipedia-en"
    assert abs(sampled_bytes[english] / sample_total - corpus_bytes_by_source[english] / corpus_total) < 0.05


def test_holdout_is_disjoint_from_the_training_sample(sampled):
    config, samples = sampled
    train = set(sample_files.training_texts(config, samples))
    held = [r["text"] for r in sample_files.holdout_records(config, samples)]
    assert len(held) > 50 and not train & set(held)
    assert all("source" in r for r in sample_files.holdout_records(config, samples))


def test_same_seed_gives_the_same_sample_and_another_seed_another(tmp_path, sampled, inputs):
    config, samples = sampled
    again = make_config(tmp_path / "again", inputs)
    other = make_config(tmp_path / "other", inputs, seed=1)
    assert list(sample_files.training_texts(again, run_sample(again))) == list(
        sample_files.training_texts(config, samples)
    )
    assert list(sample_files.training_texts(other, run_sample(other))) != list(
        sample_files.training_texts(config, samples)
    )


def test_stratification_represents_a_group_the_proportional_sample_misses(tmp_path, inputs):
    # The Japanese novel is one document of 1.1 MB in 65 MB: a 300 KB proportional sample takes it with
    # probability ~0.5%; stratified by source, every source gets at least min_group_size. It is longer (in UTF-8)
    # than tokenizer.reference_piece_bytes: the sample holds an excerpt of it, whole lines of about 1 MiB.
    novel = "aozora-bunko via google/sentencepiece data/"
    plain = make_config(tmp_path / "plain", inputs, sample_size="300KB")
    stratified = make_config(tmp_path / "strat", inputs, sample_size="300KB", stratify_by="source",
                             min_group_size="64KB")  # fmt: skip
    plain_texts = list(sample_files.training_texts(plain, run_sample(plain)))
    samples = run_sample(stratified)
    texts = list(sample_files.training_texts(stratified, samples))
    novel_text = read_jsonl(next(CORPORA.glob("multilingual/aozora*.jsonl.gz")))[0]["text"]
    (excerpt,) = [text for text in texts if text in novel_text]
    assert not any(text in novel_text for text in plain_texts)
    assert 0.5 * (1 << 20) < len(excerpt.encode()) < 1.05 * (1 << 20) < len(novel_text.encode())
    sizes = sample_files.group_sizes(samples)
    assert set(sizes) == {novel, "udhr (nltk_data udhr2)", "xquad", "wikipedia-en"}
    assert sizes["wikipedia-en"]["sample_bytes"] > 0.6 * sum(s["sample_bytes"] for s in sizes.values())
    # every other group keeps its proportional sample; the tops-ups only add
    assert set(plain_texts) <= set(texts)


@pytest.fixture(scope="module")
def plain_enwiki(tmp_path_factory):
    """The English corpus as one plain JSONL file (54 MB): the input that the sample reads in blocks."""
    return write_enwiki(tmp_path_factory.mktemp("plain") / "enwiki.jsonl")


def held_out(
    out, path, shard_size: str, id_field: str | None, holdout_size: str = "500KB", **read
) -> tuple[list[dict], list[str]]:
    """The held-out sample for a pretrained tokenizer's fertility report (no training sample)."""
    config = TokenmillConfig.model_validate({
        "name": "holdout-test",
        "input": {"paths": [str(path)], "id_field": id_field, **read},
        "partition": {"shard_size": shard_size},
        "tokenizer": {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json")},
        "fertility": {"holdout_size": holdout_size},
        "output": {"path": str(out)},
    })  # fmt: skip
    samples = run_sample(config)
    return samples, [r["text"] for r in sample_files.holdout_records(config, samples)]


@pytest.mark.parametrize("id_field", ["id", None])
def test_held_out_sample_of_plain_jsonl_reads_a_few_percent_the_same_whatever_the_shards(
    tmp_path, plain_enwiki, id_field
):
    corpus = plain_enwiki.stat().st_size
    small, small_texts = held_out(tmp_path / "small", plain_enwiki, "8MB", id_field)
    large, large_texts = held_out(tmp_path / "large", plain_enwiki, "25MB", id_field)
    assert len(small) == 7 and len(large) == 3  # 54 MB in shards of 8 MB and of 25 MB
    for samples in (small, large):
        assert sum(s.bytes_read for s in samples) < 0.05 * corpus  # 1 block of 64 KiB in 30 (+ line ends)
        assert all(s.holdout_documents > 0 for s in samples)  # every shard contributes
        assert 0.7 * 500_000 < sum(s.holdout_bytes for s in samples) < 1.1 * 500_000
    assert not any(s.documents for s in small)  # no training sample for a pretrained tokenizer
    assert sorted(small_texts) == sorted(large_texts) and len(set(small_texts)) == len(small_texts) > 100


def test_held_out_sample_of_small_jsonl_files_opens_only_the_files_it_draws_from(tmp_path, plain_enwiki, monkeypatch):
    """A crawl's small parts: the English corpus as about 400 JSONL files of 128 KB (two sample blocks each). A file
    whose drawn block would start past its end is not opened (its size is looked up); the sample is the one that
    opening every file gives, and the same whatever the shards."""
    from tokenmill.io import readers

    parts, lines = tmp_path / "parts", plain_enwiki.read_bytes().splitlines(keepends=True)
    parts.mkdir()
    part, held, count = [], 0, 0
    for line in lines + [b""]:
        part.append(line)
        held += len(line)
        if held >= 128 << 10 or not line:
            (parts / f"part-{count:04d}.jsonl").write_bytes(b"".join(part))
            part, held, count = [], 0, count + 1
    opened, open_piece = set(), readers.open_piece
    monkeypatch.setattr(readers, "open_piece", lambda piece, *a: opened.add(piece.path) or open_piece(piece, *a))
    small, small_texts = held_out(tmp_path / "small", parts, "8MB", None)
    assert count >= 400 and len(opened) < 0.2 * count  # a block of 64 KiB in 27 drawn, of 2 or 3 a file
    assert 0.5 * 500_000 < sum(s.holdout_bytes for s in small) < 1.5 * 500_000  # about 30 blocks drawn
    large, large_texts = held_out(tmp_path / "large", parts, "25MB", None)
    monkeypatch.setattr(sampling, "whole_file_sizes", lambda *_: {})
    every, every_texts = held_out(tmp_path / "every", parts, "8MB", None)
    assert len(small) > len(large) and len(opened) == count
    assert sorted(small_texts) == sorted(large_texts) == sorted(every_texts)


def test_held_out_sample_of_separated_text_reads_a_few_percent_the_same_whatever_the_shards(tmp_path, plain_enwiki):
    """The English corpus's texts as one text file split by `<|endoftext|>` lines (TinyStories' layout): read in
    blocks too, not whole, and a document's block is fixed by the file, not by where the partition cut it."""
    stories = tmp_path / "stories.txt"
    with open(stories, "w") as f:
        f.writelines(record["text"] + "\n<|endoftext|>\n" for record in read_jsonl(plain_enwiki))
    corpus, text = stories.stat().st_size, {"separator": "<|endoftext|>"}
    small, small_texts = held_out(tmp_path / "small", stories, "8MB", None, **text)
    large, large_texts = held_out(tmp_path / "large", stories, "25MB", None, **text)
    assert len(small) == 7 and len(large) == 3
    for samples in (small, large):
        assert sum(s.bytes_read for s in samples) < 0.05 * corpus  # not the whole of each piece
        assert all(s.holdout_documents > 0 for s in samples)
        assert 0.7 * 500_000 < sum(s.holdout_bytes for s in samples) < 1.1 * 500_000
    assert sorted(small_texts) == sorted(large_texts) and len(set(small_texts)) == len(small_texts) > 100


@pytest.mark.parametrize("layout", ["parquet", "arrow"])
def test_held_out_sample_of_parquet_and_arrow_reads_a_few_groups_of_rows_the_same_whatever_the_shards(
    tmp_path, plain_enwiki, layout
):
    """A Parquet file's row groups and an Arrow file's record batches are the sample's blocks: one in `stride` is
    read, not the file decoded whole, and a document's block is fixed by the file, not by where the partition cut it
    (a group of several shards too, cut into ranges of its rows). A file with fewer groups than the stride (the small
    one's 3) still gives documents."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = list(read_jsonl(plain_enwiki))
    table = pa.table({"id": [r["id"] for r in records], "text": [r["text"] for r in records]})

    def write(path: Path, rows: pa.Table, group_rows: int) -> Path:
        if layout == "parquet":
            pq.write_table(rows, path, row_group_size=group_rows)
        else:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, rows.schema) as writer:
                writer.write_table(rows, max_chunksize=group_rows)
        return path

    big = write(tmp_path / f"enwiki.{layout}", table, 100)  # 320 groups of about 170 KB
    small, small_texts = held_out(tmp_path / "small", big, "8MB", "id")
    large, large_texts = held_out(tmp_path / "large", big, "25MB", "id")
    assert len(small) == 7 and len(large) == 3
    for samples in (small, large):
        assert sum(s.bytes_read for s in samples) < 0.1 * table.nbytes  # about 1 group in 27
        assert 0.6 * 500_000 < sum(s.holdout_bytes for s in samples) < 1.4 * 500_000
    assert sorted(small_texts) == sorted(large_texts) and len(set(small_texts)) == len(small_texts) > 100

    rows = table.slice(0, 900)
    samples, _ = held_out(tmp_path / "few", write(tmp_path / f"few.{layout}", rows, 300), "8MB", None, "50KB")
    assert len(samples) == 1 and samples[0].holdout_documents > 0 and samples[0].bytes_read < 0.4 * rows.nbytes

    one = write(tmp_path / f"one.{layout}", table, len(records))  # one group, cut into ranges of its rows
    sizes = ["1MB", "3MB"] if layout == "parquet" else ["8MB", "25MB"]  # a Parquet range is 8 shards
    small, small_texts = held_out(tmp_path / "one-small", one, sizes[0], "id")
    large, large_texts = held_out(tmp_path / "one-large", one, sizes[1], "id")
    assert len(small) == 7 and len(large) == 2
    assert sorted(small_texts) == sorted(large_texts) and len(set(small_texts)) == len(small_texts) > 100


def test_holdout_records_of_shard_ids_are_those_of_the_sample_results(sampled):
    """The report is sent the shard ids alone (a result dict per shard went through Dask's scheduler)."""
    config, samples = sampled
    ids = np.array([s.shard_id for s in samples])
    assert list(sample_files.holdout_records(config, ids)) == list(sample_files.holdout_records(config, samples))


def test_a_corpus_grown_by_a_small_file_keeps_its_shards_samples(tmp_path):
    """The held-out fraction is rounded down to four significant bits: a corpus that grows by a few percent has the
    same one, so the shards it had keep their committed samples and only the new file's shard is sampled (with the
    exact fraction every shard was sampled again); grown by a third, it is another fraction, at most 12% under the
    exact one."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    articles = read_jsonl(CORPORA / "enwiki_slice" / "enwiki_slice.jsonl.gz")
    for k in range(4):  # four files of 2,000 articles
        with open(corpus / f"part-{k}.jsonl", "wb") as f:
            f.writelines(
                orjson.dumps({**d, "id": f"{d['id']}-{k}"}) + b"\n" for d in articles[2000 * k : 2000 * (k + 1)]
            )
    config = TokenmillConfig.model_validate({
        "name": "grow", "input": {"paths": [str(corpus)], "id_field": "id"}, "partition": {"shard_size": "4MB"},
        "tokenizer": {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json")}, "fertility": {"holdout_size": "300KB"},
        "output": {"path": str(tmp_path / "out")},
    })  # fmt: skip

    def sample() -> tuple[float, dict[bytes, float]]:
        """The held-out fraction, and each shard's sample marker's mtime by what the shard holds."""
        plan = plan_shards(config)
        f, g = sampling.fractions(config, plan)
        assert 0.875 < g / (300_000 / sum(s.bytes for s in plan.shards)) <= 1.0
        for shard in plan.shards:
            sampling.sample_shard(sampling.Sampling.of(config, f, g), shard)
        markers = tmp_path / "out" / "_commits" / "sample"
        return g, {s.source: (markers / f"shard-{s.shard_id:05d}.json").stat().st_mtime_ns for s in plan.shards}

    g, before = sample()
    with open(corpus / "part-4.jsonl", "wb") as f:  # 1% more
        f.writelines(orjson.dumps({**d, "id": f"{d['id']}-4"}) + b"\n" for d in articles[:20])
    grown, after = sample()
    assert grown == g and len(after) == len(before) + 1
    assert {source: after[source] for source in before} == before  # no shard it had was sampled again
    with open(corpus / "part-5.jsonl", "wb") as f:  # a third more
        f.writelines(orjson.dumps({**d, "id": f"{d['id']}-5"}) + b"\n" for d in articles[:2700])
    assert sample()[0] < g
