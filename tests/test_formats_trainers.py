"""Pretraining text in each trainer's own layout (docs/train-*.md), loaded by the trainer's own package: one run over
the bundled corpus (GPT-2, several shards, train and val) with every layout on, and what each trainer's class yields
compared with the Megatron `.bin`/`.idx` read by hand (`MegatronReader`), for every document, in order, with its EOD
where that trainer expects it. datatrove (nanotron) and HF datasets run in the suite; OLMo-core and litdata (LitGPT)
cannot share the test venv and run in `make trainers` (marked trainers), MosaicML streaming (llm-foundry) in a venv of
its own there (marked streaming)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tokenmill import layout
from tokenmill.formats.megatron import MegatronReader
from tokenmill.stats import COLUMNS
from tokenmill.storage import Store
from tokenmill.validate import Checking, ShardFiles, check_shard

from .conftest import EXAMPLES

EOD = 50256  # GPT-2's <|endoftext|>, after every document
VOCAB = 50257
SEQ_LEN = 256  # pack.seq_len: the tokens of an MDS row
LAYOUTS = ["olmo", "datatrove", "litdata", "hf_parquet", "mds"]
SPLITS = ("train", "val")


@pytest.fixture(scope="module")
def dataset(run_cli, tmp_path_factory) -> Path:
    """The bundled corpus in 1 MB shards, in every trainer's layout: the published version's directory."""
    root = tmp_path_factory.mktemp("text-trainers")
    config = {
        "name": "trainers",
        "input": {"paths": [str(EXAMPLES / "data" / "*.jsonl*")], "id_field": "id"},
        "partition": {"shard_size": "1MB"},
        "split": {"train": 0.9, "val": 0.1},
        "tokenizer": {"path": str(EXAMPLES / "tokenizers" / "gpt2" / "tokenizer.json")},
        "pack": {"mode": "concat", "seq_len": SEQ_LEN},
        "output": {"path": str(root / "build"), "formats": ["megatron", "packed", *LAYOUTS]},
    }
    (root / "trainers.yaml").write_text(json.dumps(config))
    run_cli("run", str(root / "trainers.yaml"))
    published = root / "build" / "trainers"
    return published / (published / "LATEST").read_text().strip()


def shards(root: Path, split: str) -> list[MegatronReader]:
    """The split's Megatron files, shard by shard in name order (the order of every layout's files)."""
    return [MegatronReader(idx.with_suffix("")) for idx in sorted((root / "megatron" / split).glob("*.idx"))]


def documents(root: Path, split: str) -> list[np.ndarray]:
    """Every document of the split, in order, EOD last, as the `.bin` holds it."""
    return [reader[i] for reader in shards(root, split) for i in range(len(reader))]


def windows(root: Path, split: str, size: int) -> list[np.ndarray]:
    """The split's tokens cut into `size`-token windows, shard by shard, each shard's tail dropped: what a reader
    whose samples never cross a file yields."""
    return cut([np.asarray(reader.tokens) for reader in shards(root, split)], size)


def cut(arrays: list[np.ndarray], size: int) -> list[np.ndarray]:
    """Each array cut into `size`-long windows, its tail dropped."""
    return [array[i * size : (i + 1) * size] for array in arrays for i in range(len(array) // size)]


def test_the_run_has_several_shards_and_documents_end_with_eod(dataset):
    readers = shards(dataset, "train")
    assert len(readers) >= 3 and len(shards(dataset, "val")) >= 3
    assert all(doc[-1] == EOD for split in SPLITS for doc in documents(dataset, split))


def test_every_layout_is_in_the_manifest_and_inspect_verifies_it(dataset, run_cli, tmp_path):
    """Each shard's split has every layout's files, listed with their kind, size and sha256; litdata's and MDS's
    index.json beside them; `tokenmill inspect --verify` checks them all."""
    manifest = json.loads((dataset / "manifest.json").read_text())
    listed = {f["path"]: f for f in manifest["files"]}
    for split in SPLITS:
        for reader in shards(dataset, split):
            shard = int(Path(reader.index.path).name[len("shard-") : -len(".idx")])
            for format in LAYOUTS:
                for rel in layout.trainer_files(format, split, shard):
                    entry = listed[rel]
                    assert entry["bytes"] == (dataset / rel).stat().st_size and len(entry["sha256"]) == 64
                    assert entry["split"] == split and entry["shard"] == shard
                    assert entry["kind"].split("-")[0] == format.split("_")[0]
        for format in layout.INDEXED_TRAINERS:
            assert listed[layout.trainer_index(format, split)]["kind"] == f"{format}-index"
    assert "verified" in run_cli("inspect", str(dataset), "--verify").stdout
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    (copy / layout.trainer_file("litdata", "train", 0)).write_bytes(b"")
    failed = run_cli("inspect", str(copy), "--verify", check=False)
    assert failed.returncode != 0 and "litdata/train/shard-00000.bin: 0 bytes" in failed.stdout + failed.stderr


def test_validate_names_each_damaged_layout_file(dataset, tmp_path):
    """validate's check of a shard's files (as each shard's chain runs it) against the stats: each layout damaged
    in its own way is named."""
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    rows = [r for r in json.loads((copy / layout.STATS).read_text()) if r["shard_id"] == 0]
    check = Checking(Store(str(copy)), VOCAB, None, EOD, None, EOD, None, tuple(LAYOUTS), SEQ_LEN)

    def problems() -> list[str]:
        return check_shard(check, ShardFiles(0, [{k: r[k] for k in COLUMNS} for r in rows]))

    assert problems() == []
    damaged = {
        "olmo": ("olmo/train/shard-00000.csv.gz", gzip.compress(b"0,1,x\n")),
        "datatrove": ("datatrove/train/shard-00000.ds.index", np.arange(1, 4, dtype="<u8").tobytes()),
        "litdata": ("litdata/train/shard-00000.bin", b"\x01\x00\x00\x00" + bytes(8)),
        "mds": ("mds/train/shard-00000.mds", b"\x00" * 40),
    }
    for rel, data in damaged.values():
        (copy / rel).write_bytes(data)
    (copy / "hf_parquet/train/shard-00000.parquet").unlink()
    found = "\n".join(problems())
    for rel, _ in damaged.values():
        assert f"{rel}: " in found
    assert "hf_parquet/train/shard-00000.parquet: missing" in found


def test_nanotron_reads_datatrove_files_in_windows_with_each_document_s_positions(dataset):
    """datatrove's `DatatroveFolderDataset` over a split's folder, as nanotron's nanosets open it (`*.ds`, not
    recursive): samples of seq_len + 1 tokens that never cross a file, and positions that restart at every document
    (from `.ds.index`); `.ds.metadata` names the tokenizer and the token size."""
    from datatrove.utils.dataset import DatatroveFolderDataset

    seq_len = 127
    for split in SPLITS:
        folder = dataset / "datatrove" / split
        samples = DatatroveFolderDataset(
            str(folder), seq_len=seq_len, filename_pattern="*.ds", recursive=False, token_size=2, return_positions=True
        )
        expected = windows(dataset, split, seq_len + 1)
        within = [np.concatenate([np.arange(n) for n in reader.index.lengths]) for reader in shards(dataset, split)]
        positions = cut(within, seq_len + 1)  # each token's position in its document
        assert len(samples) == len(expected) > 0
        for i, (tokens, where) in enumerate(zip(expected, positions, strict=True)):
            sample = samples[i]
            assert np.array_equal(sample["input_ids"].numpy(), tokens)
            first = np.argmax(where == 0) if (where == 0).any() else len(where)
            where = np.r_[where[:first] - where[0], where[first:]]  # the window's start is a position 0 too
            assert np.array_equal(sample["positions"].numpy(), where)
        metadata = (folder / "shard-00000.ds.metadata").read_text().split("\n")
        assert metadata[0] == f"{EXAMPLES / 'tokenizers' / 'gpt2'}|2"
        assert metadata[1] == str(len(shards(dataset, split)[0].tokens))


def test_hf_datasets_loads_a_row_per_document(dataset, tmp_path, monkeypatch):
    """`load_dataset("parquet", data_dir=...)`, map-style and streaming: its splits from the folders, a row per
    document in order, `input_ids` uint16 with EOD last."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    from datasets import load_dataset

    loaded = load_dataset("parquet", data_dir=str(dataset / "hf_parquet"))
    assert set(loaded) == {"train", "validation"}  # datasets' name for a val folder
    assert loaded["train"].features["input_ids"].feature.dtype == "uint16"
    for split, name in (("train", "train"), ("val", "validation")):
        docs = documents(dataset, split)
        rows = loaded[name].with_format("numpy")
        assert len(rows) == len(docs)
        assert all(np.array_equal(row["input_ids"], doc) for row, doc in zip(rows, docs, strict=True))
    streamed = load_dataset("parquet", data_dir=str(dataset / "hf_parquet"), split="train", streaming=True)
    docs = documents(dataset, "train")
    assert [row["input_ids"] for row in streamed] == [doc.tolist() for doc in docs]


@pytest.mark.trainers
def test_litgpt_streams_litdata_chunks_in_blocks(dataset, tmp_path, monkeypatch):
    """litdata's `StreamingDataset` with `TokensLoader(block_size)`, as LitGPT's `LitData` opens a split: blocks that
    never cross a chunk (a shard), in order, the documents' EOD inside the stream."""
    monkeypatch.setenv("DATA_OPTIMIZER_CACHE_FOLDER", str(tmp_path / "cache"))
    from litdata import StreamingDataset, TokensLoader

    block = SEQ_LEN + 1  # LitGPT's max_seq_length + 1
    for split in SPLITS:
        blocks = StreamingDataset(str(dataset / "litdata" / split), item_loader=TokensLoader(block_size=block))
        expected = windows(dataset, split, block)
        got = [np.asarray(b) for b in blocks]
        assert len(blocks) == len(got) == len(expected) > 0
        assert all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True))


@pytest.mark.trainers
def test_olmo_core_reads_fixed_length_windows_and_each_document(dataset, tmp_path, monkeypatch):
    """OLMo-core's `NumpyFSLDataset` over a split's `.npy` files: windows of sequence_length that never cross a file;
    its `NumpyPaddedFSLDataset`, its documents from the `.csv.gz`: one instance per document, EOD last, padded."""
    from olmo_core.data import NumpyFSLDataset, NumpyPaddedFSLDataset

    monkeypatch.setenv("OLMO_DATA_PREP_WORKERS", "1")
    monkeypatch.setenv("OLMO_DATA_PREP_USE_ARRAY_IF_LOCAL", "false")  # the .csv.gz, not EOD in the array
    options = {"pad_token_id": EOD, "eos_token_id": EOD, "vocab_size": VOCAB, "dtype": np.uint16}
    for split in SPLITS:
        paths = sorted(str(p) for p in (dataset / "olmo" / split).glob("*.npy"))
        fixed = NumpyFSLDataset(*paths, sequence_length=SEQ_LEN, **options)
        fixed.work_dir = tmp_path / f"fsl-{split}"
        fixed.prepare()
        expected = windows(dataset, split, SEQ_LEN)
        assert len(fixed) == len(expected) > 0
        assert all(np.array_equal(fixed[i]["input_ids"].numpy(), e) for i, e in enumerate(expected))
        docs = documents(dataset, split)
        longest = -(-max(map(len, docs)) // 64) * 64
        padded = NumpyPaddedFSLDataset(*paths, sequence_length=longest, **options)
        padded.work_dir = tmp_path / f"padded-{split}"
        padded.prepare()
        assert len(padded) == len(docs)
        for i, doc in enumerate(docs):
            ids = padded[i]["input_ids"].numpy()
            assert np.array_equal(ids[: len(doc)], doc) and (ids[len(doc) :] == EOD).all()


def import_streaming():
    """`streaming`, whose `import` imports its vision datasets and so torchvision: PyPI's torchvision for torch
    2.13 is a CUDA build that fails on the CPU torch (`operator torchvision::nms does not exist`), and `make
    trainers` leaves it out; text never uses it, so the two names streaming imports from it are stood in for."""
    import importlib.machinery
    import sys
    import types

    import torch.utils.data

    if importlib.util.find_spec("torchvision") is None:
        names = ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional")
        modules = {name: types.ModuleType(name) for name in names}
        for module in modules.values():
            module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
        modules["torchvision.datasets"].VisionDataset = torch.utils.data.Dataset
        modules["torchvision.transforms.functional"].to_tensor = lambda x: x
        sys.modules.update(modules)
    import streaming

    return streaming


@pytest.mark.streaming
def test_llm_foundry_reads_mds_rows_of_seq_len(dataset):
    """streaming's `StreamingDataset` over a split's MDS shards, each sample decoded as llm-foundry's
    `StreamingTextDataset._read_binary_tokenized_sample` does (its `tokens` column, cut to max_seq_len, as int64):
    rows of pack.seq_len tokens of the documents joined by their EOD, that never cross a shard."""
    import torch

    streaming = import_streaming()
    for split in SPLITS:
        rows = streaming.StreamingDataset(local=str(dataset / "mds" / split), shuffle=False, batch_size=1)
        expected = windows(dataset, split, SEQ_LEN)
        assert len(rows) == len(expected) > 0
        for i, row in enumerate(expected):
            sample = torch.from_numpy(rows[i]["tokens"][:SEQ_LEN].copy()).to(torch.int64)  # llm-foundry's decoding
            assert np.array_equal(sample.numpy(), row)
