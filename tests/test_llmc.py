"""llm.c token shards byte for byte: the 256-int32 header llm.c's `dev/data/data_common.py` writes and its
`llmc/dataloader.h` checks, then the tokens; the uint32 variant; damaged files named."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from tokenmill.formats.llmc import CorruptLlmcFile, LlmcReader, llmc_dtype, shard_bounds, write_llmc


def test_uint16_file_byte_layout(tmp_path):
    write_llmc(tmp_path / "a.bin", np.array([50256, 1, 2, 65535]), np.uint16)
    data = (tmp_path / "a.bin").read_bytes()
    assert data == struct.pack("<3i", 20240520, 1, 4) + bytes(253 * 4) + struct.pack("<4H", 50256, 1, 2, 65535)


def test_uint32_variant_for_large_vocabularies(tmp_path):
    write_llmc(tmp_path / "b.bin", np.array([128000, 7]), llmc_dtype(128256))
    data = (tmp_path / "b.bin").read_bytes()
    assert data == struct.pack("<3i", 20240801, 7, 2) + bytes(253 * 4) + struct.pack("<2I", 128000, 7)


def test_dtype_follows_the_vocabulary():
    assert llmc_dtype(50257) == np.uint16 and llmc_dtype(65536) == np.uint16 and llmc_dtype(65537) == np.uint32


def test_round_trip(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 2**16, 1000)
    write_llmc(tmp_path / "c.bin", tokens, np.uint16)
    reader = LlmcReader(tmp_path / "c.bin")
    assert reader.dtype == np.uint16 and np.array_equal(reader.tokens, tokens)


def test_bad_magic_and_truncation_are_reported_with_the_file(tmp_path):
    write_llmc(tmp_path / "d.bin", np.arange(10), np.uint16)
    data = (tmp_path / "d.bin").read_bytes()
    (tmp_path / "d.bin").write_bytes(data[:-2])
    with pytest.raises(CorruptLlmcFile, match=r"d\.bin: 1042 bytes, the header promises 10 uint16 tokens"):
        LlmcReader(tmp_path / "d.bin")
    (tmp_path / "d.bin").write_bytes(struct.pack("<i", 20240522) + data[4:])
    with pytest.raises(CorruptLlmcFile, match=r"d\.bin: magic 20240522 version 1"):
        LlmcReader(tmp_path / "d.bin")


def test_shards_are_cut_at_the_cap():
    assert shard_bounds(250, 100) == [(0, 100), (100, 200), (200, 250)]
    assert shard_bounds(200, 100) == [(0, 100), (100, 200)]
    assert shard_bounds(0, 100) == []


@pytest.mark.parametrize(("tokens", "counted"), [(0, 1), (250, 2), (150, 3)])
def test_stats_that_count_other_llmc_files_than_the_tokens_need_fail_naming_the_file(tmp_path, tokens, counted):
    """validate holds a split's llm.c files against its stats (`formats.llmc.check`), also where the split has no
    tokens but its stats count files: the stats' files are checked, and the count named."""
    from types import SimpleNamespace

    from tokenmill.formats import llmc
    from tokenmill.formats.table import SplitFound

    row = SimpleNamespace(split="train", shard_id=0, tokens=tokens, llmc_files=counted)
    run = SimpleNamespace(llmc_shard_tokens=100, vocab_size=50257)
    needed = -(-tokens // 100)
    rels = llmc.split_files(row, run)
    assert len(rels) == max(counted, needed)  # validate finds those the stats count missing, too
    paths = [tmp_path / f"{k}.bin" for k in range(len(rels))]
    for path in paths:
        write_llmc(path, np.zeros(min(100, tokens), np.uint16), np.uint16)
    found = SplitFound(rels, paths, row, np.uint16, 0, run)
    assert llmc.check(found) == [f"{rels[0]}: stats say {counted} llm.c files, {tokens} tokens need {needed}"]
