"""The pretraining trainers' layouts byte for byte, both ways (`tokenmill/formats/`: datatrove, litdata, mds,
hf_parquet): each holds the Megatron `.bin`'s ids as they are, for uint16 and for int32 ids (vocabularies of 65,500
and more), where datatrove's own width rule and tokenmill's differ; damaged files are named. Their trainers load
them in test_formats_trainers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tokenmill.formats import datatrove, hf_parquet, litdata, mds
from tokenmill.formats.megatron import token_dtype

LENGTHS = np.array([3, 1, 5, 2])
SMALL = np.array([7, 8, 50256, 50256, 1, 2, 3, 4, 50256, 9, 50256], dtype=np.uint16)  # GPT-2 ids
LARGE = (SMALL.astype(np.int64) * 2 + 70_000).astype(np.int32)  # ids over 65,535


@pytest.mark.parametrize("tokens", [SMALL, LARGE], ids=["uint16", "int32"])
def test_datatrove_files_are_the_bin_bytes_with_each_documents_end(tokens):
    index, metadata = datatrove.sidecars(tokens, LENGTHS, "openai-community/gpt2")  # beside the .bin's bytes
    assert np.frombuffer(index, "<u8").tolist() == [3, 4, 9, 11]
    size = tokens.dtype.itemsize  # 4 for int32, where datatrove's rule says 2 up to 65,536 ids
    assert metadata.decode() == f"openai-community/gpt2|{size}\n11\n11.0T"


def test_datatrove_reads_int32_ids_with_the_token_size_written(tmp_path):
    """A vocabulary between 65,500 and 65,536 ids: tokenmill writes int32, datatrove reads 4 bytes when told so."""
    from datatrove.utils.dataset import DatatroveFolderDataset

    assert token_dtype(65_520) == np.int32 and datatrove.token_size(token_dtype(65_520)) == 4
    (tmp_path / "a.ds").write_bytes(LARGE.tobytes())  # the .bin's bytes
    (tmp_path / "a.ds.index").write_bytes(datatrove.sidecars(LARGE, LENGTHS, "tok")[0])
    samples = DatatroveFolderDataset(str(tmp_path), seq_len=4, filename_pattern="*.ds", recursive=False, token_size=4)
    assert [s["input_ids"].tolist() for s in samples] == [LARGE[:5].tolist(), LARGE[5:10].tolist()]


@pytest.mark.parametrize("tokens", [SMALL, LARGE], ids=["uint16", "int32"])
def test_litdata_chunk_is_a_header_of_document_offsets_then_the_bin_bytes(tmp_path, tokens):
    path = tmp_path / "shard-00000.bin"
    with open(path, "wb") as f:
        litdata.write_chunk(f, tokens, LENGTHS, name="litdata/train/shard-00000.bin")
    data = path.read_bytes()
    header = 4 * (len(LENGTHS) + 2)
    offsets = header + np.r_[0, np.cumsum(LENGTHS)] * tokens.dtype.itemsize
    assert data == np.r_[len(LENGTHS), offsets].astype("<u4").tobytes() + tokens.tobytes()
    ids, lengths = litdata.read_chunk(path, tokens.dtype, name="x")
    assert ids.tolist() == tokens.tolist() and lengths.tolist() == LENGTHS.tolist()
    index = litdata.index([{"filename": path.name, "documents": 4, "tokens": 11}], tokens.dtype)
    assert index["chunks"] == [{"chunk_bytes": len(data), "chunk_size": 4, "dim": 11, "filename": path.name}]
    code = {np.dtype(np.uint16): 5, np.dtype(np.int32): 2}[tokens.dtype]  # litdata's numpy dtype table
    assert index["config"]["data_format"] == [f"no_header_numpy:{code}"]


def test_a_damaged_chunk_is_named(tmp_path):
    path = tmp_path / "c.bin"
    with open(path, "wb") as f:
        litdata.write_chunk(f, SMALL, LENGTHS, name="c")
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(litdata.CorruptChunk, match="litdata/train/shard-00003.bin: its offsets"):
        litdata.read_chunk(path, np.uint16, name="litdata/train/shard-00003.bin")


@pytest.mark.parametrize("tokens", [SMALL, LARGE], ids=["uint16", "int32"])
def test_mds_shard_is_rows_of_seq_len_after_its_config(tmp_path, tokens):
    path = tmp_path / "shard-00000.mds"
    with open(path, "wb") as f:
        assert mds.write_shard(f, tokens, 4, name="x") == 2  # 11 tokens: two rows of 4, the last 3 in none
    data = path.read_bytes()
    config = json.dumps(mds.config(tokens.dtype, 4), sort_keys=True).encode()
    start = 4 * 4 + len(config)
    assert np.frombuffer(data[:16], "<u4").tolist() == [2, start, start + 4 * tokens.dtype.itemsize, len(data)]
    assert data[16:start] == config and data[start:] == tokens[:8].tobytes()
    assert mds.config(tokens.dtype, 4)["column_encodings"] == [f"ndarray:{tokens.dtype.name}:4"]
    assert mds.read_rows(path, tokens.dtype, 4, name="x").tolist() == tokens[:8].reshape(2, 4).tolist()
    entry = mds.index([{"filename": path.name, "rows": 2}], tokens.dtype, 4)["shards"][0]
    assert entry["raw_data"] == {"basename": path.name, "bytes": len(data), "hashes": {}} and entry["samples"] == 2
    with pytest.raises(mds.CorruptShard, match="mds/val/shard-00001.mds: .* not an MDS shard of 8-token"):
        mds.read_rows(path, tokens.dtype, 8, name="mds/val/shard-00001.mds")


@pytest.mark.parametrize("tokens", [SMALL, LARGE], ids=["uint16", "int32"])
def test_parquet_has_a_row_of_ids_per_document_in_the_bin_dtype(tmp_path, tokens):
    import pyarrow.parquet as pq

    hf_parquet.write_parquet(tmp_path / "s.parquet", tokens, LENGTHS, vocab_size=200_000)
    table = pq.read_table(tmp_path / "s.parquet")
    field = f"pyarrow.Field<input_ids: list<element: {tokens.dtype.name} not null> not null>"
    assert str(table.schema.field("input_ids")) == field
    starts = np.r_[0, np.cumsum(LENGTHS)[:-1]]
    assert table["input_ids"].to_pylist() == [tokens[s : s + n].tolist() for s, n in zip(starts, LENGTHS, strict=True)]
    ids, lengths = hf_parquet.read_documents(tmp_path / "s.parquet")
    assert ids.tolist() == tokens.tolist() and lengths.tolist() == LENGTHS.tolist()
    data = (tmp_path / "s.parquet").read_bytes()  # the ids are dictionary indices, bit-packed at their own width
    assert (
        data.startswith(b"PAR1")
        and data.endswith(b"PAR1")
        and tokens.astype(tokens.dtype.newbyteorder("<")).tobytes() in data
    )


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_parquet_pages_and_row_groups_cut_between_documents_read_back_in_every_reader(tmp_path, monkeypatch, dtype):
    """Many row groups and pages (a page cut between documents, a document longer than a page its own), empty
    documents, read by pyarrow whole and batch by batch (as `datasets` streams), and by polars."""
    import polars as pl
    import pyarrow.parquet as pq

    monkeypatch.setattr(hf_parquet, "PAGE_VALUES", 1000)
    monkeypatch.setattr(hf_parquet, "ROW_GROUP_DOCUMENTS", 700)
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 600, 3000)
    lengths[[5, 6, 2999]] = 0
    lengths[100] = 4321  # over four pages' worth
    vocab = 60_000 if dtype == np.uint16 else 200_000
    tokens = rng.integers(0, vocab, int(lengths.sum())).astype(dtype)
    path = tmp_path / "s.parquet"
    hf_parquet.write_parquet(path, tokens, lengths, vocab)
    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_rows == 3000 and metadata.num_row_groups == 5
    assert [metadata.row_group(i).num_rows for i in range(5)] == [700] * 4 + [200]
    ids, read_lengths = hf_parquet.read_documents(path)
    assert np.array_equal(ids, tokens) and np.array_equal(read_lengths, lengths)
    batches = [b.column("input_ids") for b in pq.ParquetFile(path).iter_batches(batch_size=256)]
    assert sum(len(b) for b in batches) == 3000
    assert np.array_equal(np.concatenate([b.values.to_numpy() for b in batches]), tokens)
    column = pl.read_parquet(path)["input_ids"]
    assert column.list.len().to_list() == lengths.tolist()
    assert np.array_equal(column.explode().drop_nulls().to_numpy(), tokens)


def test_the_text_layouts_refuse_an_input_of_conversations(tmp_path):
    """datatrove, litdata, mds and hf_parquet carry no loss mask: a chat input's conversations go to trl,
    megatron_bridge or olmo."""
    from pydantic import ValidationError

    from tokenmill.config import TokenmillConfig

    config = {
        "name": "chat",
        "input": {"paths": [str(tmp_path / "c.jsonl")], "chat": {"format": "messages"}},
        "tokenizer": {"path": str(tmp_path / "tokenizer.json")},
        "output": {"path": str(tmp_path / "out"), "formats": ["megatron", "packed", "olmo", "litdata", "mds"]},
    }
    with pytest.raises(ValidationError, match="output.formats litdata, mds hold text without a loss mask"):
        TokenmillConfig.model_validate(config)


def test_nanotron_finds_the_tokenizer_as_the_config_names_it():
    assert datatrove.tokenizer_name("hf:openai-community/gpt2") == "openai-community/gpt2"
    assert datatrove.tokenizer_name("/models/gpt2/tokenizer.json") == "/models/gpt2"
    assert datatrove.tokenizer_name("/models/gpt2") == "/models/gpt2"
    assert datatrove.tokenizer_name(None) == "tokenizer"  # a trained one: the dataset's own tokenizer/


def test_split_indexes_list_each_shard_with_documents_and_forget_a_dropped_layout(tmp_path):
    """litdata's index lists every shard of a split with documents; MDS's those with a row (a shard of fewer tokens
    than a row has no sample); a layout no longer asked for loses its index."""
    import pandas as pd

    from tokenmill.config import TokenmillConfig
    from tokenmill.stages.pack import write_split_indexes
    from tokenmill.tokenizers.tokenizer_info import TokenizerInfo

    def config(formats: list[str]) -> TokenmillConfig:
        return TokenmillConfig.model_validate(
            {
                "name": "indexes",
                "input": {"paths": [str(tmp_path / "in.jsonl")]},
                "split": {"train": 1.0},
                "tokenizer": {"path": str(tmp_path / "tokenizer.json")},
                "pack": {"seq_len": 100},
                "output": {"path": str(tmp_path / "out"), "formats": formats},
            }
        )

    table = pd.DataFrame(
        {"shard_id": [2, 0, 1], "split": "train", "documents": [5, 3, 0], "tokens": [250, 60, 0], "packed_rows": 0}
    )
    tokenizer = TokenizerInfo(sha256="", vocab_size=50257, eod_id=50256, trained=False)
    write_split_indexes(config(["megatron", "litdata", "mds"]), tokenizer, table)
    out = tmp_path / "out"
    chunks = json.loads((out / "litdata/train/index.json").read_text())["chunks"]
    assert [(c["filename"], c["chunk_size"], c["dim"]) for c in chunks] == [
        ("shard-00000.bin", 3, 60),
        ("shard-00002.bin", 5, 250),
    ]
    shards = json.loads((out / "mds/train/index.json").read_text())["shards"]
    assert [(s["raw_data"]["basename"], s["samples"]) for s in shards] == [("shard-00002.mds", 2)]
    write_split_indexes(config(["megatron", "litdata"]), tokenizer, table)
    assert (out / "litdata/train/index.json").exists() and not (out / "mds/train/index.json").exists()
