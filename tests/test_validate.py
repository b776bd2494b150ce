"""validate refuses a dataset whose counts do not reconcile or whose files are damaged, naming the file."""

from __future__ import annotations

import json
import shutil

import pytest

from tokenmill.config import load_config
from tokenmill.tokenizer import TokenizerInfo
from tokenmill.validate import ValidationFailed, stats_table, validate

from .conftest import EXAMPLES


@pytest.fixture
def dataset(gpt2_run, tmp_path):
    """A private copy of the published dataset and the inputs validate needs, to damage at will."""
    out = tmp_path / "copy"
    shutil.copytree(gpt2_run, out)
    config = load_config(EXAMPLES / "gpt2.yaml", [f"output.path={out}", "partition.shard_size=1MB"])
    plan = json.loads((out / "plan.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    tokenizer = TokenizerInfo(**{k: manifest["tokenizer"][k] for k in ("sha256", "vocab_size", "eod_id", "trained")})

    def results(stage):
        return [json.loads(p.read_text())["result"] for p in sorted((out / "_commits" / stage).glob("*.json"))]

    return out, config, plan, tokenizer, stats_table(results("tokenize"), results("pack"))


def test_intact_dataset_validates(dataset):
    out, *args = dataset
    table = validate(*args)
    assert len(table) == len(args[1]["shards"]) * 2 and table.equals(args[3])


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
