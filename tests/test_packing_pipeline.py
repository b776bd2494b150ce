"""The pack and shuffle stages over real tokenized shards (the library stages in order, no Prefect): every
mode's files hold the tokenized documents as promised, validate accepts them and refuses damaged ones
naming the file, and the manifest lists them with their kinds and the packing stats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tokenmill.config import TokenmillConfig
from tokenmill.core.stats import ValidationFailed, stats_table
from tokenmill.formats.llmc import LlmcReader
from tokenmill.formats.megatron import MegatronReader
from tokenmill.formats.packed import PackedReader
from tokenmill.stages.pack import Packing, pack_shard, write_split_indexes
from tokenmill.stages.partition import load_or_plan
from tokenmill.stages.publish import Files, publish
from tokenmill.stages.tokenize import Tokenizing, tokenize_shard
from tokenmill.stages.train_tokenizer import install_pretrained
from tokenmill.stages.validate import validate

from .conftest import EXAMPLES, TOKENIZERS

GPT2_EOD = 50256
MODES = {
    "concat": {"mode": "concat", "seq_len": 1024},
    "concat_extra_token": {"mode": "concat", "seq_len": 1024, "extra_token": True},
    "bfd": {"mode": "bfd", "seq_len": 1024},
    "window": {"mode": "window", "seq_len": 512, "stride": 64, "bos_id": 50256, "eos_id": 50256, "pad_id": 0},
}


def dataset_config(out: Path, pack: dict, **output) -> TokenmillConfig:
    return TokenmillConfig.model_validate(
        {
            "name": "packing",
            "input": {"paths": [str(EXAMPLES / "data" / "*.jsonl*")], "id_field": "id"},
            "partition": {"shard_size": "1MB"},
            "split": {"train": 0.9, "val": 0.1},
            "tokenizer": {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json")},
            "pack": pack,
            "output": {"path": str(out), "formats": ["megatron", "packed", "llmc"], **output},
        }
    )


def build_dataset(config: TokenmillConfig) -> tuple:
    """partition, tokenize[shard], pack[shard], split_indexes, validate, publish, as the flow runs them."""
    plan, _ = load_or_plan(config)
    tokenizer = install_pretrained(config)
    tokenized = [tokenize_shard(Tokenizing.of(config, tokenizer), shard) for shard in plan.shards]
    packed = [pack_shard(Packing.of(config, tokenizer), t) for t in tokenized]
    table = stats_table(tokenized, packed)
    write_split_indexes(config, tokenizer, table)
    with Files() as files:
        publish(config, plan, tokenizer, validate(config, plan, tokenizer, table), files)
    manifest = config.output.store().read_json("manifest.json")  # as users read it
    return manifest, (config, plan, tokenizer, table), (tokenized, packed)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict:
    """One dataset per pack mode (llm.c files capped at 100k tokens, so shards have several)."""
    base = tmp_path_factory.mktemp("packing")
    return {
        name: (base / name, *build_dataset(dataset_config(base / name, pack, llmc_shard_tokens=100_000)))
        for name, pack in MODES.items()
    }


def documents(out: Path, split: str, shard: int) -> list[np.ndarray]:
    reader = MegatronReader(out / f"megatron/{split}/shard-{shard:05d}")
    return [reader[i] for i in range(len(reader))]


def packed_shards(manifest: dict) -> list[tuple[str, int]]:
    return sorted((f["split"], f["shard"]) for f in manifest["files"] if f["kind"] == "packed-tokens")


def rows_and_cuts(out: Path, split: str, shard: int) -> list[tuple[np.ndarray, np.ndarray]]:
    reader = PackedReader(out / f"packed/{split}/shard-{shard:05d}")
    return [reader[i] for i in range(len(reader))]


@pytest.mark.parametrize("mode", ["concat", "concat_extra_token"])
def test_concat_rows_hold_the_document_stream(datasets, mode):
    out, manifest, *_ = datasets[mode]
    seq_len = 1024
    for split, shard in packed_shards(manifest):
        docs = documents(out, split, shard)
        rows = rows_and_cuts(out, split, shard)
        stream = np.concatenate([*(r[:seq_len] for r, _ in rows[:-1]), rows[-1][0][: rows[-1][1][-1]]])
        assert np.array_equal(stream, np.concatenate(docs))
        ends = set(np.cumsum([len(d) for d in docs]).tolist())
        for i, (_, cu) in enumerate(rows):
            assert {i * seq_len + int(c) for c in cu[1:-1]} == {
                e for e in ends if i * seq_len < e < i * seq_len + cu[-1]
            }


def test_bfd_rows_hold_every_document_whole_or_in_row_sized_pieces(datasets):
    out, manifest, *_ = datasets["bfd"]
    for split, shard in packed_shards(manifest):
        docs = documents(out, split, shard)
        found = [row[a:b] for row, cu in rows_and_cuts(out, split, shard) for a, b in zip(cu[:-1], cu[1:], strict=True)]
        expected = [d[i : i + 1024] for d in docs for i in range(0, len(d), 1024)]
        assert sorted(p.tobytes() for p in found) == sorted(p.tobytes() for p in expected)
        for row, cu in rows_and_cuts(out, split, shard):
            assert np.all(row[cu[-1] :] == GPT2_EOD)  # the pad id defaults to EOD


def test_window_rows_hold_each_document_with_the_overlap(datasets):
    out, manifest, *_ = datasets["window"]
    stride = 64
    for split, shard in packed_shards(manifest):
        rows = iter(rows_and_cuts(out, split, shard))
        for doc in documents(out, split, shard):
            rebuilt: list[int] = []
            while len(rebuilt) < len(doc):
                row, cu = next(rows)
                assert row[0] == row[cu[-1] - 1] == GPT2_EOD and np.all(row[cu[-1] :] == 0)
                window = row[1 : cu[-1] - 1].tolist()
                if rebuilt:
                    assert window[:stride] == rebuilt[-stride:]
                    window = window[stride:]
                rebuilt += window
            assert rebuilt == doc.tolist()
        assert next(rows, None) is None


def test_llmc_files_hold_each_split_stream_under_the_cap(datasets):
    out, manifest, *_ = datasets["bfd"]
    llmc = [f for f in manifest["files"] if f["kind"] == "llmc"]
    assert any(f["path"].endswith("-0001.bin") for f in llmc)  # the 100k cap cut a shard in parts
    for split, shard in {(f["split"], f["shard"]) for f in llmc}:
        parts = sorted(f["path"] for f in llmc if (f["split"], f["shard"]) == (split, shard))
        readers = [LlmcReader(out / p) for p in parts]
        assert all(r.dtype == np.uint16 and len(r) <= 100_000 for r in readers)
        assert np.array_equal(np.concatenate([r.tokens for r in readers]), np.concatenate(documents(out, split, shard)))


def test_shuffle_index_is_a_permutation_of_every_packed_row(datasets):
    out, manifest, *_ = datasets["concat"]
    for split in ("train", "val"):
        index = np.load(out / f"packed/{split}/shuffle.npy")
        rows = {(shard, r) for s, shard in packed_shards(manifest) if s == split
                for r in range(len(PackedReader(out / f"packed/{split}/shard-{shard:05d}")))}  # fmt: skip
        assert index.dtype == np.int32 and len(index) == len(rows) == len(set(map(tuple, index.tolist())))
        assert set(map(tuple, index.tolist())) == rows
        assert not np.array_equal(index[:, 0], np.sort(index[:, 0]))  # shuffled across shards


def test_manifest_reports_packing_stats_beside_the_padded_layout(datasets):
    for name, (out, manifest, *_) in datasets.items():
        kinds = {f["path"]: f["kind"] for f in manifest["files"]}
        assert kinds["packed/train/shuffle.npy"] == "packed-shuffle"
        assert {"packed-tokens", "packed-cu-seqlens", "packed-row-offsets", "llmc"} <= set(kinds.values())
        stats = json.loads((out / "stats.json").read_text())
        total = manifest["packing"]
        assert (
            total["sequences"]
            == sum(r["packed_rows"] for r in stats)
            == sum(s["packing"]["sequences"] for s in manifest["splits"].values())
        )
        row_len = 1025 if name == "concat_extra_token" else MODES[name]["seq_len"]
        assert total["real_tokens"] + total["pad_tokens"] == total["sequences"] * row_len
        assert total["utilization"] == round(total["real_tokens"] / (total["sequences"] * row_len), 6)
        padded = total["padded_layout"]
        seq_len = MODES[name]["seq_len"]
        assert padded["utilization"] == round(manifest["counts"]["tokens"] / (padded["sequences"] * seq_len), 6)
        if name != "window":
            assert total["utilization"] > 0.95 > padded["utilization"]
    bfd = datasets["bfd"][1]["packing"]
    assert bfd["real_tokens"] == datasets["bfd"][1]["counts"]["tokens"]


def test_repacking_with_another_mode_reuses_the_tokenized_shards(datasets, tmp_path):
    out = tmp_path / "repack"
    shutil.copytree(datasets["concat"][0], out)
    manifest, _, (tokenized, packed) = build_dataset(dataset_config(out, MODES["bfd"], llmc_shard_tokens=100_000))
    assert all(t.reused for t in tokenized) and not any(p.reused for p in packed)
    assert manifest["packing"] == datasets["bfd"][1]["packing"]


@pytest.fixture
def damaged(datasets, tmp_path):
    """A private copy of the bfd dataset and validate's arguments for it, to damage at will."""
    out = tmp_path / "copy"
    shutil.copytree(datasets["bfd"][0], out)
    _, _, (config, *rest), _ = datasets["bfd"]
    return out, (config.model_copy(update={"output": config.output.model_copy(update={"path": str(out)})}), *rest)


def test_a_shuffle_index_that_repeats_a_row_fails_naming_the_file(damaged):
    out, args = damaged
    index = np.load(out / "packed/train/shuffle.npy")
    index[1] = index[0]
    np.save(out / "packed/train/shuffle.npy", index)
    with pytest.raises(ValidationFailed, match=r"packed/train/shuffle\.npy: not a permutation"):
        validate(*args)


def test_a_damaged_llmc_header_fails_naming_the_file(damaged):
    out, args = damaged
    path = out / "llmc/train/shard-00000-0000.bin"
    data = bytearray(path.read_bytes())
    data[0] ^= 1  # the magic
    path.write_bytes(bytes(data))
    with pytest.raises(ValidationFailed, match=r"llmc/train/shard-00000-0000\.bin: magic 20240521"):
        validate(*args)


def test_a_bfd_row_with_tokens_after_its_real_length_fails_naming_the_file(damaged):
    out, args = damaged
    prefix = out / "packed/val/shard-00000"
    rows = np.load(f"{prefix}.tokens.npy")
    real = np.load(f"{prefix}.cu_seqlens.npy")[np.load(f"{prefix}.row_offsets.npy")[1:] - 1]
    rows[np.argmin(real), real.min()] = 7  # the first pad slot of the emptiest row
    np.save(f"{prefix}.tokens.npy", rows)
    with pytest.raises(ValidationFailed, match=r"packed/val/shard-00000\.tokens\.npy: tokens other than pad"):
        validate(*args)
