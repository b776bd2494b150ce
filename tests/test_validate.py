"""validate refuses a dataset whose counts do not reconcile or whose files are damaged, naming the file."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from tokenmill.config import load_config
from tokenmill.core.commits import commit
from tokenmill.core.plan import Plan, Shard
from tokenmill.core.stats import Packed, StatsColumns, Tokenized, ValidationFailed, stats_table, table_of
from tokenmill.formats.packed import PAD_CHECK_BYTES, only_pad_after
from tokenmill.stages.validate import records as validate_records
from tokenmill.stages.validate import validate
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo

from .conftest import EXAMPLES, read_jsonl


@pytest.fixture
def dataset(gpt2_run, tmp_path):
    """A private copy of the published dataset and the inputs validate needs, to damage at will."""
    out = tmp_path / "copy"
    shutil.copytree(gpt2_run, out)
    config = load_config(EXAMPLES / "gpt2.yaml", [f"output.path={out}", "partition.shard_size=1MB"])
    plan = Plan.read(config.output.store())
    manifest = json.loads((out / "manifest.json").read_text())
    tokenizer = TokenizerInfo(**{k: manifest["tokenizer"][k] for k in ("sha256", "vocab_size", "eod_id", "trained")})

    def results(stage, kind):
        return [
            kind.from_json(json.loads(p.read_text())["result"])
            for p in sorted((out / "_commits" / stage).glob("*.json"))
        ]

    return out, config, plan, tokenizer, stats_table(results("tokenize", Tokenized), results("pack", Packed))


def test_intact_dataset_validates(dataset):
    out, *args = dataset
    table = validate(*args)
    assert len(table) == len(args[1].shards) * 2 and table.equals(args[3])


def test_one_corrupted_idx_byte_fails_naming_the_file(dataset):
    out, *args = dataset
    idx = out / "megatron/train/shard-00001.idx"
    data = bytearray(idx.read_bytes())
    data[40] ^= 0xFF  # inside the sequence lengths
    idx.write_bytes(bytes(data))
    with pytest.raises(ValidationFailed, match="megatron/train/shard-00001"):
        validate(*args)


def test_truncated_bin_fails_naming_the_file(dataset):
    out, *args = dataset
    path = out / "megatron/val/shard-00000.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ValidationFailed, match=r"megatron/val/shard-00000\.bin"):
        validate(*args)


def test_deleted_shard_file_fails_naming_it(dataset):
    out, *args = dataset
    (out / "packed/train/shard-00002.tokens.npy").unlink()
    with pytest.raises(ValidationFailed, match=r"packed/train/shard-00002\.tokens\.npy: missing"):
        validate(*args)


def test_a_document_missing_from_the_stats_fails(dataset):
    out, config, plan, tokenizer, table = dataset
    table.loc[table.shard_id == 1, "documents_in"] += 1
    with pytest.raises(ValidationFailed, match="documents_in != documents out \\+ rejected: shard 00001/train"):
        validate(config, plan, tokenizer, table)


def test_the_stats_are_checked_a_few_shards_at_a_time_and_every_failure_is_named(dataset, monkeypatch):
    """Checked in runs of whole shards (of 3 rows or more: a shard's two split rows never part): an intact table
    validates, and a shard failing in each of two runs is named with the other."""
    from tokenmill.stages import validate as library

    out, config, plan, tokenizer, table = dataset
    monkeypatch.setattr(library, "ROWS_AT_ONCE", 3)
    validate(config, plan, tokenizer, table)
    last = int(table.shard_id.max())
    assert last >= 3
    broken = table.copy()
    broken.loc[broken.shard_id.isin([0, last]), "documents_in"] += 1
    with pytest.raises(ValidationFailed, match=f"documents out \\+ rejected: shard 00000/train, shard 00000/val, "
                                               f"shard {last:05d}/train, shard {last:05d}/val$"):  # fmt: skip
        validate(config, plan, tokenizer, broken)


def test_the_check_chained_to_each_shard_finds_what_validate_would_and_validate_reports_it(dataset):
    """The tokenize stage ends each shard's chain with validate's check of its files (while they are fresh) and
    hands validate what it found: the same problems as validate's own pass, which then fails the run."""
    from tokenmill.stages.validate import Checking, check_written

    out, config, plan, tokenizer, table = dataset
    shutil.rmtree(out / "_commits" / "check")  # damaged after the check (a run's reuse check would find it first)
    path = out / "megatron/val/shard-00000.bin"
    path.write_bytes(path.read_bytes()[:-2])
    (out / "packed/train/shard-00002.tokens.npy").unlink()

    found = {
        s.shard_id: check_written(Checking.of(config, tokenizer), chain_results(out, s.shard_id)) for s in plan.shards
    }
    assert [s for s, problems in found.items() if problems] == [0, 2]
    assert any("megatron/val/shard-00000.bin" in p for p in found[0])
    assert found[2] == ["packed/train/shard-00002.tokens.npy: missing"]
    checked = [p for problems in found.values() for p in problems]
    with pytest.raises(ValidationFailed) as own_pass:
        validate(config, plan, tokenizer, table)
    with pytest.raises(ValidationFailed) as given:
        validate(config, plan, tokenizer, table, checked=checked)
    assert str(given.value) == str(own_pass.value)
    assert all(p in str(given.value) for p in checked)


def chain_results(out: Path, shard_id: int) -> tuple:
    """A shard's tokenize and pack results, as its chain hands them to `check_written`."""
    stages = {"tokenize": Tokenized, "pack": Packed}
    markers = {kind: out / "_commits" / stage / f"shard-{shard_id:05d}.json" for stage, kind in stages.items()}
    return tuple(kind.from_json(json.loads(m.read_text())["result"]) for kind, m in markers.items())


def test_a_shards_files_that_passed_the_check_as_they_are_are_not_checked_again(dataset):
    """A shard that passes the check gets a marker whose key is made of its tokenize and pack markers (every file's
    sha256) and the check's parameters: the next check of the same files takes it; other parameters or another
    marker (a shard made again) are checked again, and a check that fails leaves no marker."""
    from tokenmill.stages.validate import Checking, check_written

    out, config, plan, tokenizer, table = dataset
    shutil.rmtree(out / "_commits" / "check")
    marker, results = out / "_commits/check/shard-00001.json", chain_results(out, 1)
    run = Checking.of(config, tokenizer)
    assert check_written(run, results) == [] and marker.exists()
    made, inode = marker.read_bytes(), marker.stat().st_ino  # a marker written again is a new file
    found = check_written(replace(run, eod_id=run.eod_id - 1), results)
    assert found and marker.read_bytes() == made, found
    assert check_written(run, results) == [] and marker.stat().st_ino == inode  # taken: not checked, not rewritten

    tokenize = out / "_commits/tokenize/shard-00001.json"
    done = json.loads(tokenize.read_text())
    del done["signature"]
    done["result"]["documents_in"] += 1  # as if the shard had been made again
    commit(config.output.store(), "tokenize", 1, done["key"], done["result"], done["files"])
    assert check_written(run, results) == [] and marker.read_bytes() != made  # checked again, a new marker


def test_a_missing_shard_fails(dataset):
    out, config, plan, tokenizer, table = dataset
    with pytest.raises(ValidationFailed, match="missing or duplicated"):
        validate(config, plan, tokenizer, table[table.shard_id != 0].reset_index(drop=True))


def test_token_ids_beyond_the_vocabulary_fail(dataset):
    out, config, plan, tokenizer, table = dataset
    small = TokenizerInfo(tokenizer.sha256, 1000, tokenizer.eod_id, False)
    with pytest.raises(ValidationFailed, match="vocab size"):
        validate(config, plan, small, table)


def test_documents_without_their_bos_fail(dataset):
    """The run wrote no BOS; a config that asks for one (<|endoftext|> as BOS) must not validate it."""
    out, config, plan, tokenizer, table = dataset
    config = load_config(
        EXAMPLES / "gpt2.yaml",
        [f"output.path={out}", "partition.shard_size=1MB", "tokenizer.bos=<|endoftext|>", "tokenizer.prepend_bos=true"],
    )
    with_bos = TokenizerInfo(tokenizer.sha256, tokenizer.vocab_size, tokenizer.eod_id, False, bos_id=tokenizer.eod_id)
    with pytest.raises(ValidationFailed, match=r"megatron/\w+/shard-\d+\.bin: \d+ documents do not start with BOS"):
        validate(config, plan, with_bos, table)


def library_dataset(tmp_path, lines: list[bytes], layout: str = "jsonl", **config) -> tuple:
    """A dataset of 3 shards of one plain JSONL file made of `lines` (`layout` "compressed": of three compressed files,
    zstd, gzip and zstd, a shard each; "parquet", "arrow": of one Parquet file of 12-row groups, or one Arrow
    stream of 12-row record batches, cut at them; a record whose text is not a string has a null text in a
    table), made by the library's stages with the config's other sections `config`: (config, plan, tokenizer, stats
    table)."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from tokenmill.config import TokenmillConfig
    from tokenmill.core import stats
    from tokenmill.io.readers import Piece, ReadOptions, groups_of
    from tokenmill.stages.partition import load_or_plan
    from tokenmill.stages.tokenize import Tokenizing, tokenize_shard
    from tokenmill.stages.train_tokenizer import install_pretrained

    from .conftest import TOKENIZERS

    lines = [line + (b"\r" if i % 7 == 0 else b"") for i, line in enumerate(lines)]
    data = b"".join(line + b"\n" for line in lines)
    path, shard_size = tmp_path / "corpus.jsonl", len(data) // 3 + 1
    path.write_bytes(data)
    thirds = [len(lines) * k // 3 for k in range(4)]
    records = [orjson.loads(line) for line in lines if line.strip()]
    table = pa.table({
        "id": [r["id"] for r in records], "text": [t if isinstance(t := r["text"], str) else None for r in records]
    })  # fmt: skip
    if layout == "compressed":
        path.unlink()
        for k, (ending, compress) in enumerate([("zst", zstandard.compress), ("gz", gzip.compress)] * 2):
            if k < 3:
                part = b"".join(line + b"\n" for line in lines[thirds[k] : thirds[k + 1]])
                (tmp_path / f"corpus-{k}.jsonl.{ending}").write_bytes(compress(part))
        path, shard_size = tmp_path / "corpus-*.jsonl.*", len(data) // 6  # a file is a shard: it is not cut
    elif layout == "one zstd stream":  # cut into 3 pieces at offsets of its stream, not at line starts
        path.unlink()
        path, shard_size = tmp_path / "corpus.jsonl.zst", len(data) // 24 + 1  # a thread's share: 8 shards
        path.write_bytes(zstandard.compress(data))
    elif layout in ("parquet", "arrow"):
        path.unlink()
        path = tmp_path / f"corpus.{layout}"
        if layout == "parquet":
            pq.write_table(table, path, row_group_size=12)
        else:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table, max_chunksize=12)
        shard_size = sum(size for _, size in groups_of(Piece(str(path)), ReadOptions())) // 3 + 1
    config = TokenmillConfig.model_validate(
        {
            "name": "library",
            "input": {"paths": [str(path)], "id_field": "id"},
            "partition": {"shard_size": f"{shard_size}B"},
            "tokenizer": {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json"), "check_min_documents": 100},
            "pack": {"mode": "none"},
            "output": {"path": str(tmp_path / "out")},
            **config,
        }
    )
    plan, _ = load_or_plan(config)
    assert len(plan.shards) == 3
    tokenizer = install_pretrained(config)
    tokenized = [tokenize_shard(Tokenizing.of(config, tokenizer), shard) for shard in plan.shards]
    return config, plan, tokenizer, stats_table(tokenized, [stats.skipped(t) for t in tokenized])


def corpus_lines() -> list[bytes]:

    path = EXAMPLES / "data" / "web_dclm_annotated.jsonl.gz"
    return [orjson.dumps({"id": d["id"], "text": d["text"]}) for d in read_jsonl(path)]


@pytest.fixture
def one_split_dataset(tmp_path):
    """A one-split dataset of 3 shards of plain JSONL with blank and CRLF-ended lines among its records."""
    lines = corpus_lines()
    lines[5:5] = [b"", b"  \t"]
    return library_dataset(tmp_path, lines)


@pytest.mark.parametrize("layout", ["jsonl", "compressed", "one zstd stream", "parquet", "arrow"])
def test_the_reference_sample_reads_a_few_blocks_and_finds_each_document_where_tokenize_put_it(
    tmp_path, monkeypatch, layout
):
    """Two splits, blocks of about 20 KB (tokenize records where each lies; in a compressed file, by its place in
    the decompressed stream, also where the partition cut it anywhere; in a Parquet or Arrow file, its group of rows,
    read in several batches), blank and CRLF-ended lines, and a reject: the sample reads only blocks without rejects,
    never a whole shard, and each document it draws is the one at its split and index in the shard as tokenize read
    it; the stored ids of the sample equal the reference's (validate passes). A marker that does not say where its
    blocks lie (an earlier tokenmill's) has its documents drawn from the whole shard. Documents read from pieces whose
    first line was not counted are numbered by their line in the file once the pieces before are read."""
    from tokenmill.io.readers import block_place, read_documents
    from tokenmill.stages import validate as library

    from .conftest import TOKENIZERS

    lines = corpus_lines()
    lines[5:5] = [b"", b"  \t"]
    lines[250:250] = [b'{"id": "a number", "text": 5}']
    tokenizer = {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json"), "check_min_documents": 100, "batch_bytes": 20_000}
    config, plan, tokenizer, table = library_dataset(
        tmp_path, lines, layout, split={"train": 0.7, "val": 0.3}, tokenizer=tokenizer
    )
    assert int(table.groupby("shard_id").rejected.first().sum()) == 1
    # every document drawn is checked (auto would bound this small run's check to 256 KiB of text)
    config = config.model_copy(update={"tokenizer": config.tokenizer.model_copy(update={"check_bytes": 4_000_000})})

    markers = sorted((Path(config.output.path) / "_commits/tokenize").iterdir())
    blocks = [json.loads(marker.read_text())["result"]["blocks"] for marker in markers]
    assert min(len(b) for b in blocks) > 10
    assert sum(block[4] for shard in blocks for block in shard) == 1  # the block with the reject

    referencing = library.Referencing.of(config, tokenizer)

    def every_document(shard: Shard) -> dict:
        """(split, index) -> text of every document of the shard, read whole as tokenize read it."""
        documents = int(table[table.shard_id == shard.shard_id].documents.sum())
        item = library.ReferenceItem(shard, sample=documents, documents=documents, rejected=0, seed=1)
        found = library._from_shard(referencing, item, np.random.default_rng())
        return {(split, index): text for split, _, index, text in found}

    read = []  # the pieces the sample reads

    def reading(pieces, *args, **kwargs):
        read.extend(pieces)
        return read_documents(pieces, *args, **kwargs)

    monkeypatch.setattr(library, "read_documents", reading)
    items = library.reference_items(config, plan, table)
    assert len(items) == 3 and sum(item.sample for item in items) == 100
    rejected_at = [{start for _, start, _, _, rejects, *_ in shard if rejects} for shard in blocks]
    for item in items:
        read.clear()
        sample = library.sampled_documents(referencing, item)
        assert len(sample) == item.sample and {split for split, *_ in sample} == {"train", "val"}
        recorded = {(start, stop) for _, start, stop, *_ in blocks[item.shard_id]}
        assert 1 <= len(read) < len(recorded) and {block_place(piece) for piece in read} <= recorded
        assert not {block_place(piece)[0] for piece in read} & rejected_at[item.shard_id]
        everything = every_document(plan.shards[item.shard_id])
        assert all(everything[split, index] == text for split, _, index, text in sample)
    validate(config, plan, tokenizer, table)
    if unnumbered := [s.shard_id for s in plan.shards if s.pieces[0].first_line is None]:
        from tokenmill.formats.provenance import read_documents_table
        from tokenmill.stages.tokenize import number_lines

        number_lines(config, plan.shards, unnumbered)
        tables = sorted((Path(config.output.path) / "megatron").glob("*/*.docs.parquet"))
        numbered = sorted(line for t in tables for line in read_documents_table(t).column("line").to_pylist())
        valid = [k + 1 for k, line in enumerate(lines) if line.strip() and b'"text": 5' not in line]
        assert len(unnumbered) == 2 and numbered == valid

    first = Path(config.output.path) / "_commits/tokenize/shard-00000.json"
    marker = json.loads(first.read_text())
    del marker["result"]["blocks"]
    # as a tokenmill before blocks were recorded wrote it (signed, as every marker)
    commit(config.output.store(), "tokenize", 0, marker["key"], marker["result"], marker["files"])
    read.clear()
    item = next(item for item in items if item.shard_id == 0)
    sample = library.sampled_documents(referencing, item)
    assert len(sample) == item.sample and read == list(plan.shards[0].pieces)
    everything = every_document(plan.shards[0])
    assert all(everything[split, index] == text for split, _, index, text in sample)


def test_a_shard_of_long_documents_has_its_sample_read_from_a_few_blocks_not_whole(tmp_path, monkeypatch):
    """Books: fewer documents than the sample asks for, each longer than its excerpt. The blocks are read until they
    hold twice the text the check encodes of them (their excerpts), not until they hold twice the sample: that read
    a books corpus's every shard whole for an excerpt or two of each (3 s of a 12 s run, and its largest process).
    What is read is the documents tokenize put there, and validate passes."""
    from tokenmill.io.readers import read_documents
    from tokenmill.stages import validate as library

    from .conftest import TOKENIZERS

    texts = [d["text"] for d in read_jsonl(EXAMPLES / "data" / "web_dclm_annotated.jsonl.gz")]
    books = ["\n\n".join(texts[k::30]) for k in range(30)]  # 30 documents of about 42 KB
    lines = [orjson.dumps({"id": f"book-{k}", "text": book}) for k, book in enumerate(books)]
    tokenizer = {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json"), "batch_bytes": 20_000, "check_bytes": 60_000}
    config, plan, tokenizer, table = library_dataset(tmp_path, lines, tokenizer=tokenizer)
    read = []  # the blocks the sample reads

    def reading(pieces, *args, **kwargs):
        read.append(pieces)
        return read_documents(pieces, *args, **kwargs)

    monkeypatch.setattr(library, "read_documents", reading)
    referencing = library.Referencing.of(config, tokenizer)
    items = library.reference_items(config, plan, table)
    assert len(items) == 3 and all(item.sample == item.documents >= 8 for item in items)  # all of them
    for item in items:
        read.clear()
        sample = library.sampled_documents(referencing, item)
        excerpt = library.excerpt_bytes(item.most_bytes, referencing.piece_bytes)  # about 20 KB: of every document
        assert 1 <= len(sample) and sum(min(len(text), excerpt) for *_, text in sample) <= 2 * item.most_bytes
        assert len(read) == 2  # of its 8 to 13 blocks (a document each): two hold twice its share of the check
        everything = {text for *_, text in library._from_shard(referencing, item, np.random.default_rng())}
        assert {text for *_, text in sample} <= everything
    validate(config, plan, tokenizer, table)


def test_ids_that_differ_from_the_reference_fail_naming_the_file(one_split_dataset):
    config, plan, tokenizer, table = one_split_dataset
    bin_path = Path(config.output.path) / "megatron/train/shard-00001.bin"
    tokens = np.fromfile(bin_path, np.uint16)
    tokens[tokens != tokenizer.eod_id] = 11  # every document's ids now ","s: sizes, EOD and vocabulary still fine
    tokens.tofile(bin_path)
    with pytest.raises(ValidationFailed, match=r"re-encoded with hf differ(.|\n)*megatron/train/shard-00001\.bin") as e:
        validate(config, plan, tokenizer, table)
    # they are decoded too (only ids that differ are): GPT-2's ids of a text decode to it, these do not
    assert "does not decode to its source text" in str(e.value)


def test_the_reference_check_of_books_encodes_about_check_bytes_each_shard_an_excerpt_of_its_share(
    tmp_path, monkeypatch
):
    """Nine books of about 140 KB, three to a shard, and `tokenizer.check_bytes` of 60 KB: each shard checks a book
    on an excerpt of its share of the check (`reference.excerpt_bytes`: 20 KB), not the first book it draws whole
    (anything up to `tokenizer.reference_piece_bytes`, 1 MB). A check of a few MB over many shards of books took an
    excerpt of 1 MB from each: 10 MB for a check of 3.2 MB, 5 s of an 8 s run. Every book is still checked right."""
    from tokenmill.stages import validate as library

    from .conftest import TOKENIZERS

    texts = [orjson.loads(line)["text"] for line in corpus_lines()]
    books = [orjson.dumps({"id": f"book-{k}", "text": "\n\n".join(texts[k::9])}) for k in range(9)]
    sizes = {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json"), "check_min_documents": 9, "check_bytes": 60_000}
    config, plan, tokenizer, table = library_dataset(tmp_path, books, tokenizer=sizes)
    encoded = []  # the texts the reference encodes

    def reference_ids(store, sha256, texts, tok, piece_bytes):
        encoded.extend(texts)
        return [encoding.ids for encoding in tok.encode_batch_fast(list(texts), add_special_tokens=False)]

    monkeypatch.setattr(library, "reference_ids", reference_ids)
    run = library.Referencing.of(config, tokenizer)
    checked = [library.check_reference(run, item) for item in library.reference_items(config, plan, table)]
    assert len(checked) == 3 and all(c["documents"] == c["excerpts"] == 1 and not c["wrong"] for c in checked)
    assert 3 * 16_000 <= sum(len(text.encode()) for text in encoded) <= 1.5 * 60_000, [len(t) for t in encoded]
    validate(config, plan, tokenizer, table)


def test_the_reference_ids_of_the_verified_documents_are_not_encoded_again(one_split_dataset, tmp_path, monkeypatch):
    """The encoder choice keeps the reference's ids of the documents it verified; validate compares the stored ids
    of those with them (here every document: the corpus is smaller than the verification sample, as a small run's
    auto sizes are not), not encoding them again. Kept ids that are wrong make it fail; those of another tokenizer are
    not used."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokenmill.core import layout
    from tokenmill.stages.tokenize import choose_run_encoder, verification_sample

    config, plan, tokenizer, table = one_split_dataset
    sizes = {"verify_bytes": 4_000_000, "check_bytes": 4_000_000}
    config = config.model_copy(update={"tokenizer": config.tokenizer.model_copy(update=sizes)})
    # A cache of its own: an earlier run's verified choice would be taken without verifying (or keeping ids), and
    # emptying this user's cache let another test's run, meanwhile, keep a choice verified on another sample, whose
    # reason (the documents it counts) then differed between two manifests that test compares
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path / "cache"))
    choose_run_encoder(config, plan.shards, tokenizer)
    kept_path = Path(config.output.path) / layout.REFERENCE_IDS
    kept = pq.read_table(kept_path)
    verified = verification_sample(config, plan.shards, tokenizer)
    assert kept.num_rows == len(verified) == int(table.documents.sum())
    validate(config, plan, tokenizer, table)

    reversed_ids = pa.array([ids[::-1] for ids in kept.column("ids").to_pylist()], kept.schema.field("ids").type)
    pq.write_table(kept.set_column(1, "ids", reversed_ids), kept_path)
    with pytest.raises(ValidationFailed, match=r"100 of 100 documents re-encoded with hf differ"):
        validate(config, plan, tokenizer, table)
    another = kept.set_column(1, "ids", reversed_ids).replace_schema_metadata({"tokenizer_sha256": "0" * 64})
    pq.write_table(another, kept_path)
    validate(config, plan, tokenizer, table)


def test_stats_columns_give_the_table_of_the_rows_in_any_order(dataset):
    """A tokenize group keeps its shards' stats rows as columns (8 bytes a number), in the order they finish."""
    *_, table = dataset
    rows = list(table.itertuples(index=False, name=None))
    columns = StatsColumns()
    for start in range(len(rows) - 2, -1, -2):  # a shard's rows at a time, last shard first
        columns.add(rows[start : start + 2])
    kept = columns.table()
    pd.testing.assert_frame_equal(kept, table_of(rows))
    assert kept.equals(table) and list(validate_records(kept)) == list(validate_records(table))


def test_pad_is_checked_after_each_rows_real_tokens_in_every_block_of_rows():
    # 5,000 rows of 2,048: two blocks of padded rows (4,096 to a block); full rows are not looked at.
    assert PAD_CHECK_BYTES // 2048 == 4096
    rng = np.random.default_rng(0)
    real = rng.integers(1, 2049, 5000)
    rows = np.where(np.arange(2048) < real[:, None], rng.integers(0, 50000, (5000, 2048)), 50256).astype(np.uint16)
    assert only_pad_after(rows, real, 50256)
    padded = np.flatnonzero(real < 2048)
    row = padded[4500]  # in the second block
    rows[row, real[row]] = 7
    assert not only_pad_after(rows, real, 50256)
    rows[row, real[row]] = 50256
    rows[padded[0], -1] = 7  # the last slot of the first padded row
    assert not only_pad_after(rows, real, 50256)


@pytest.mark.parametrize("around_the_cache", [False, True])
def test_the_tokens_at_documents_ends_are_read_a_window_at_a_time(tmp_path, monkeypatch, around_the_cache):
    """The EOD and BOS checks read the `.bin` a window at a time (a map of the whole file touched at every document's
    end had the kernel map most of it: a 600 MB shard's `.bin` counted whole in the worker's peak memory); the tokens
    are those at the positions, across windows and at the file's last token. A `.bin` written around the page cache
    (no pack stage reads it again) is read back around it: none of its pages are left in the cache."""
    import numpy as np

    from tokenmill.formats import megatron as library
    from tokenmill.io.direct import UncachedFile

    from .test_faults import cached_pages

    monkeypatch.setattr(library, "CHECK_WINDOW_BYTES", 1000)
    tokens = np.arange(10_001, dtype=np.uint16)
    path = tmp_path / "x.bin"
    with UncachedFile(path) if around_the_cache else open(path, "wb") as f:
        f.write(tokens.tobytes())
    positions = np.array([0, 1, 499, 500, 501, 4_999, 5_000, 10_000])
    assert library.tokens_at(path, positions, np.dtype(np.uint16)).tolist() == positions.tolist()
    assert library.tokens_at(path, np.zeros(0, np.int64), np.dtype(np.uint16)).tolist() == []
    assert (cached_pages(path) == 0) == around_the_cache


def test_the_schema_library_is_loaded_whole_under_its_lock_before_any_thread_gets_it():
    """A worker's threads may each need pandera at once (the careful reader's checks of a batch): each gets it only
    once its first validation, which imports its pandas backends, is done, under the one lock. In a fresh
    interpreter, eight threads ask at once: each finds the backends imported, and validates."""
    import subprocess
    import sys

    script = """
import sys, threading
from tokenmill.io.readers import schema_library
found = []
def ask():
    pa = schema_library()
    loaded = "pandera.backends.pandas.container" in sys.modules
    pa.DataFrameSchema({"n": pa.Column(int)}).validate(__import__("pandas").DataFrame({"n": [1]}))
    found.append(loaded)
threads = [threading.Thread(target=ask) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(found)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == str([True] * 8), result.stdout + result.stderr
