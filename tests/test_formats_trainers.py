"""Pretraining text in each trainer's own layout (docs/train-*.md), loaded by the trainer's own package: one run of a
mixture of the three bundled sources (GPT-2, several shards, train and val) with every layout on. What each trainer's
class yields is compared with the Megatron `.bin`/`.idx` read by hand (`MegatronReader`), for every document of every
source and split, in order, with its EOD where that trainer expects it; and each trainer, given the run's
`mix/<format>/train.json`, draws each source within 1% of its resolved share. datatrove (nanotron) and HF datasets run
in the suite; OLMo-core and litdata (LitGPT) cannot share the test venv and run in `make trainers` (marked trainers),
MosaicML streaming (llm-foundry) in a venv of its own there (marked streaming)."""

from __future__ import annotations

import collections
import gzip
import itertools
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tokenmill.core import layout
from tokenmill.core.stats import COLUMNS
from tokenmill.formats.megatron import MegatronReader
from tokenmill.io.storage import Store
from tokenmill.stages.validate import Checking, ShardFiles, check_shard

from .conftest import EXAMPLES
from .docs_blocks import page_blocks, run_python

EOD = 50256  # GPT-2's <|endoftext|>, after every document
VOCAB = 50257
SEQ_LEN = 256  # pack.seq_len: the tokens of an MDS row
LAYOUTS = ["olmo", "datatrove", "litdata", "hf_parquet", "mds"]
SOURCES = {  # examples/mix.yaml's sources, their weights
    "wiki": ("wikitext2_raw_test.jsonl", 0.5),
    "web": ("web_dclm_annotated.jsonl.gz", 0.3),
    "news": ("web_scrapinghub_aeb.jsonl.gz", 0.2),
}
SPLITS = ("train", "val")
STREAMS = [f"{source}/{split}" for source in SOURCES for split in SPLITS]  # a folder of each layout each


@pytest.fixture(scope="module")
def dataset(run_cli, tmp_path_factory) -> Path:
    """The bundled sources mixed, in 1 MB shards, in every trainer's layout: the published version's directory."""
    root = tmp_path_factory.mktemp("text-trainers")
    sources = [
        {"name": name, "input": {"paths": [str(EXAMPLES / "data" / file)]}, "weight": weight}
        for name, (file, weight) in SOURCES.items()
    ]
    config = {
        "name": "trainers",
        "sources": sources,
        "partition": {"shard_size": "1MB"},
        "split": {"train": 0.8, "val": 0.2},
        "tokenizer": {"path": str(EXAMPLES / "tokenizers" / "gpt2" / "tokenizer.json")},
        "pack": {"mode": "concat", "seq_len": SEQ_LEN},
        "output": {"path": str(root / "build"), "formats": ["megatron", "packed", *LAYOUTS]},
    }
    (root / "trainers.yaml").write_text(json.dumps(config))
    run_cli("run", str(root / "trainers.yaml"))
    published = root / "build" / "trainers"
    return published / (published / "LATEST").read_text().strip()


def shards(root: Path, stream: str) -> list[MegatronReader]:
    """The stream's Megatron files, shard by shard in name order (the order of every layout's files)."""
    return [MegatronReader(idx.with_suffix("")) for idx in sorted((root / "megatron" / stream).glob("*.idx"))]


def documents(root: Path, stream: str) -> list[np.ndarray]:
    """Every document of the stream, in order, EOD last, as the `.bin` holds it."""
    return [reader[i] for reader in shards(root, stream) for i in range(len(reader))]


def windows(root: Path, stream: str, size: int) -> list[np.ndarray]:
    """The stream's tokens cut into `size`-token windows, shard by shard, each shard's tail dropped: what a reader
    whose samples never cross a file yields."""
    return cut([np.asarray(reader.tokens) for reader in shards(root, stream)], size)


def cut(arrays: list[np.ndarray], size: int) -> list[np.ndarray]:
    """Each array cut into `size`-long windows, its tail dropped."""
    return [array[i * size : (i + 1) * size] for array in arrays for i in range(len(array) // size)]


def trainer_mix(root: Path, format: str) -> dict:
    return json.loads((root / layout.mix_trainer_file(format, "train")).read_text())


def shares(root: Path) -> dict[str, float]:
    """Each source's resolved share of the training tokens, as the manifest says it."""
    mix = json.loads((root / "manifest.json").read_text())["mix"]
    return {name: source["share"] for name, source in mix["sources"].items()}


def owners(root: Path, size: int) -> dict[bytes, str]:
    """The source of every `size`-token window of the training streams (as int64 bytes), to tell a drawn sample's."""
    return {
        window.astype(np.int64).tobytes(): source
        for source in SOURCES
        for window in windows(root, f"{source}/train", size)
    }


def assert_drawn_in_shares(drawn: collections.Counter, root: Path) -> None:
    total = sum(drawn.values())
    assert total > 1000 and set(drawn) == set(SOURCES)
    for source, share in shares(root).items():
        assert abs(drawn[source] / total - share) < 0.01, (source, drawn[source] / total, share)


def test_every_source_has_several_shards_and_documents_end_with_eod(dataset):
    assert sum(len(shards(dataset, f"{source}/train")) for source in SOURCES) >= 4
    assert all(doc[-1] == EOD for stream in STREAMS for doc in documents(dataset, stream))


def test_every_layout_is_in_the_manifest_and_inspect_verifies_it(dataset, run_cli, tmp_path):
    """Each shard's stream has every layout's files, listed with their kind, size and sha256; litdata's and MDS's
    index.json beside them, and the trainers' mixes; `tokenmill inspect --verify` checks them all."""
    manifest = json.loads((dataset / "manifest.json").read_text())
    listed = {f["path"]: f for f in manifest["files"]}
    for stream in STREAMS:
        for reader in shards(dataset, stream):
            shard = int(Path(reader.index.path).name[len("shard-") : -len(".idx")])
            for format in LAYOUTS:
                for rel in layout.trainer_files(format, stream, shard):
                    entry = listed[rel]
                    assert entry["bytes"] == (dataset / rel).stat().st_size and len(entry["sha256"]) == 64
                    assert entry["split"] == stream and entry["shard"] == shard
                    assert entry["kind"].split("-")[0] == format.split("_")[0]
        for format in layout.INDEXED_TRAINERS:
            assert listed[layout.trainer_index(format, stream)]["kind"] == f"{format}-index"
    assert all(listed[layout.mix_trainer_file(format, "train")]["kind"] == "mix" for format in LAYOUTS)
    shown = run_cli("inspect", str(dataset), "--verify").stdout
    assert "verified" in shown and f"  litdata: {dataset}/mix/litdata/train.json" in shown
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    chunk = min(rel for rel in listed if rel.startswith("litdata/") and rel.endswith(".bin"))
    (copy / chunk).write_bytes(b"")
    failed = run_cli("inspect", str(copy), "--verify", check=False)
    assert failed.returncode != 0 and f"{chunk}: 0 bytes" in failed.stdout + failed.stderr


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
    stream = next(r["split"] for r in rows if r["split"].endswith("/train"))
    files = {format: layout.trainer_files(format, stream, 0) for format in LAYOUTS}
    damaged = {
        files["olmo"][1]: gzip.compress(b"0,1,x\n"),  # the .csv.gz
        files["datatrove"][1]: np.arange(1, 4, dtype="<u8").tobytes(),  # the .ds.index
        files["litdata"][0]: b"\x01\x00\x00\x00" + bytes(8),
        files["mds"][0]: b"\x00" * 40,
    }
    for rel, data in damaged.items():
        (copy / rel).write_bytes(data)
    (copy / files["hf_parquet"][0]).unlink()
    found = "\n".join(problems())
    assert all(f"{rel}: " in found for rel in damaged)
    assert f"{files['hf_parquet'][0]}: missing" in found


def test_nanotron_reads_datatrove_files_in_windows_with_each_document_s_positions(dataset):
    """datatrove's `DatatroveFolderDataset` over a stream's folder, as nanotron's nanosets open it (`*.ds`, not
    recursive): samples of seq_len + 1 tokens that never cross a file, and positions that restart at every document
    (from `.ds.index`); `.ds.metadata` names the tokenizer and the token size."""
    from datatrove.utils.dataset import DatatroveFolderDataset

    seq_len = 127
    for stream in STREAMS:
        folder = dataset / "datatrove" / stream
        samples = DatatroveFolderDataset(
            str(folder), seq_len=seq_len, filename_pattern="*.ds", recursive=False, token_size=2, return_positions=True
        )
        expected = windows(dataset, stream, seq_len + 1)
        within = [np.concatenate([np.arange(n) for n in reader.index.lengths]) for reader in shards(dataset, stream)]
        positions = cut(within, seq_len + 1)  # each token's position in its document
        assert len(samples) == len(expected) > 0
        for i, (tokens, where) in enumerate(zip(expected, positions, strict=True)):
            sample = samples[i]
            assert np.array_equal(sample["input_ids"].numpy(), tokens)
            first = np.argmax(where == 0) if (where == 0).any() else len(where)
            where = np.r_[where[:first] - where[0], where[first:]]  # the window's start is a position 0 too
            assert np.array_equal(sample["positions"].numpy(), where)
        first = sorted(folder.glob("*.ds.metadata"))[0]
        metadata = first.read_text().split("\n")
        assert metadata[0] == f"{EXAMPLES / 'tokenizers' / 'gpt2'}|2"
        assert metadata[1] == str(len(shards(dataset, stream)[0].tokens))


def test_nanotrons_mix_is_each_source_folder_with_its_share(dataset):
    """nanotron's `dataset_folder` and `dataset_weights`: each source's training folder, its share. nanotron itself
    draws them (`build_nanoset_index_helper`, its exact deterministic blend) but is not installable here."""
    from datatrove.utils.dataset import DatatroveFolderDataset

    mix = trainer_mix(dataset, "datatrove")
    assert mix["dataset_folder"] == [str(dataset / "datatrove" / source / "train") for source in SOURCES]
    assert mix["dataset_weights"] == [shares(dataset)[source] for source in SOURCES]
    for folder, source in zip(mix["dataset_folder"], SOURCES, strict=True):
        samples = DatatroveFolderDataset(folder, seq_len=63, filename_pattern="*.ds", recursive=False, token_size=2)
        assert len(samples) == len(windows(dataset, f"{source}/train", 64))


def test_hf_datasets_loads_a_row_per_document(dataset, tmp_path, monkeypatch):
    """`load_dataset("parquet", data_dir=...)` of a source's folder, map-style and streaming: its splits from the
    folders, a row per document in order, `input_ids` uint16 with EOD last."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    from datasets import load_dataset

    for source in SOURCES:
        loaded = load_dataset("parquet", data_dir=str(dataset / "hf_parquet" / source))
        assert set(loaded) == {"train", "validation"}  # datasets' name for a val folder
        assert loaded["train"].features["input_ids"].feature.dtype == "uint16"
        for split, name in (("train", "train"), ("val", "validation")):
            docs = documents(dataset, f"{source}/{split}")
            rows = loaded[name].with_format("numpy")
            assert len(rows) == len(docs)
            assert all(np.array_equal(row["input_ids"], doc) for row, doc in zip(rows, docs, strict=True))
    streamed = load_dataset(
        "parquet", data_dir=str(dataset / "hf_parquet" / "wiki" / "train"), split="train", streaming=True
    )
    assert [row["input_ids"] for row in streamed] == [doc.tolist() for doc in documents(dataset, "wiki/train")]


def test_hf_datasets_interleaves_each_sources_tokens_in_its_share(dataset, tmp_path, monkeypatch):
    """`interleave_datasets` of the sources' training folders with the mix's probabilities, which draw documents:
    40,000 documents drawn hold each source's tokens within 1% of its share."""
    import pyarrow.compute as pc

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    from datasets import interleave_datasets, load_dataset

    mix = trainer_mix(dataset, "hf_parquet")
    parts = []
    for folder, source in zip(mix["data_dirs"], SOURCES, strict=True):
        part = load_dataset("parquet", data_dir=folder, split="train")
        parts.append(part.add_column("source", [source] * len(part)).repeat(150))  # not exhausted before 40,000 draws
    drawn = interleave_datasets(parts, probabilities=mix["probabilities"], seed=0).select(range(40_000))
    tokens = collections.Counter()
    for batch in drawn.with_format("arrow").iter(batch_size=10_000):
        lengths = pc.list_value_length(batch["input_ids"]).to_numpy()
        for source in SOURCES:
            tokens[source] += int(lengths[pc.equal(batch["source"], source).to_numpy(zero_copy_only=False)].sum())
    assert_drawn_in_shares(tokens, dataset)


def test_the_nanotron_pages_loader_reads_a_sources_folder(dataset):
    """docs/train-nanotron.md's loader as it is, on the wiki source's training folder: its windows."""
    (loader,) = page_blocks("docs/train-nanotron.md")
    folder = str(dataset / "datatrove" / "wiki" / "train")
    train = run_python(loader, {"/data/web/<version>/datatrove/train": folder})["train"]
    expected = windows(dataset, "wiki/train", 2048 + 1)
    assert len(train) == len(expected) > 0
    assert np.array_equal(train[0]["input_ids"].numpy(), expected[0])


def test_the_hf_datasets_pages_snippets_load_a_source_and_the_mix(dataset, tmp_path, monkeypatch):
    """docs/train-hf-datasets.md's two snippets as they are: a source's splits and its streamed training rows, and
    the mix's interleaving of every source."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    single, mixed = page_blocks("docs/train-hf-datasets.md")
    loaded = run_python(single, {"/data/web/<version>/hf_parquet": str(dataset / "hf_parquet" / "wiki")})
    assert set(loaded["dataset"]) == {"train", "validation"}
    assert [row["input_ids"] for row in loaded["train"]] == [d.tolist() for d in documents(dataset, "wiki/train")]
    drawn = next(iter(run_python(mixed, {"/data/mix/<version>": str(dataset)})["train"]))
    assert any(drawn["input_ids"] == d.tolist() for s in SOURCES for d in documents(dataset, f"{s}/train"))


@pytest.mark.trainers
def test_litgpt_streams_litdata_chunks_in_blocks(dataset, tmp_path, monkeypatch):
    """litdata's `StreamingDataset` with `TokensLoader(block_size)`, as LitGPT's `LitData` opens a split: blocks that
    never cross a chunk (a shard), in order, the documents' EOD inside the stream."""
    monkeypatch.setenv("DATA_OPTIMIZER_CACHE_FOLDER", str(tmp_path / "cache"))
    from litdata import StreamingDataset, TokensLoader

    block = SEQ_LEN + 1  # LitGPT's max_seq_length + 1
    for stream in STREAMS:
        blocks = StreamingDataset(str(dataset / "litdata" / stream), item_loader=TokensLoader(block_size=block))
        expected = windows(dataset, stream, block)
        got = [np.asarray(b) for b in blocks]
        assert len(blocks) == len(got) == len(expected) > 0
        assert all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True))


@pytest.mark.trainers
def test_litdata_combines_the_sources_in_their_shares(dataset, tmp_path, monkeypatch):
    """`CombinedStreamingDataset` of the mix's folders with its weights: 20,000 blocks, each source's within 1%."""
    monkeypatch.setenv("DATA_OPTIMIZER_CACHE_FOLDER", str(tmp_path / "cache"))
    from litdata import CombinedStreamingDataset, StreamingDataset, TokensLoader

    mix, block = trainer_mix(dataset, "litdata"), 16
    parts = [StreamingDataset(d, item_loader=TokensLoader(block_size=block), shuffle=True) for d in mix["input_dirs"]]
    combined = CombinedStreamingDataset(parts, weights=mix["weights"], seed=3, iterate_over_all=False)
    owner = owners(dataset, block)
    drawn = itertools.islice(combined, 20_000)
    assert_drawn_in_shares(collections.Counter(owner[np.asarray(b).astype(np.int64).tobytes()] for b in drawn), dataset)


@pytest.mark.trainers
def test_olmo_core_reads_fixed_length_windows_and_each_document(dataset, tmp_path, monkeypatch):
    """OLMo-core's `NumpyFSLDataset` over a stream's `.npy` files: windows of sequence_length that never cross a
    file; its `NumpyPaddedFSLDataset`, its documents from the `.csv.gz`: one instance per document, EOD last, padded."""
    from olmo_core.data import NumpyFSLDataset, NumpyPaddedFSLDataset

    monkeypatch.setenv("OLMO_DATA_PREP_WORKERS", "1")
    monkeypatch.setenv("OLMO_DATA_PREP_USE_ARRAY_IF_LOCAL", "false")  # the .csv.gz, not EOD in the array
    options = {"pad_token_id": EOD, "eos_token_id": EOD, "vocab_size": VOCAB, "dtype": np.uint16}
    for k, stream in enumerate(STREAMS):
        paths = sorted(str(p) for p in (dataset / "olmo" / stream).glob("*.npy"))
        fixed = NumpyFSLDataset(*paths, sequence_length=SEQ_LEN, **options)
        fixed.work_dir = tmp_path / f"fsl-{k}"
        fixed.prepare()
        expected = windows(dataset, stream, SEQ_LEN)
        assert len(fixed) == len(expected) > 0
        assert all(np.array_equal(fixed[i]["input_ids"].numpy(), e) for i, e in enumerate(expected))
        docs = documents(dataset, stream)
        longest = -(-max(map(len, docs)) // 64) * 64
        padded = NumpyPaddedFSLDataset(*paths, sequence_length=longest, **options)
        padded.work_dir = tmp_path / f"padded-{k}"
        padded.prepare()
        assert len(padded) == len(docs)
        for i, doc in enumerate(docs):
            ids = padded[i]["input_ids"].numpy()
            assert np.array_equal(ids[: len(doc)], doc) and (ids[len(doc) :] == EOD).all()


@pytest.mark.trainers
def test_olmo_core_source_mixture_draws_each_source_in_its_share(dataset, tmp_path, monkeypatch):
    """OLMo-core's source mixture from the mix's sources (`SourceMixtureList`): each source's instances within 1% of
    its share of the instances the mixture draws."""
    from olmo_core.data import NumpyFSLDatasetConfig, TokenizerConfig
    from olmo_core.data.source_mixture import SourceMixtureConfig, SourceMixtureDatasetConfig, SourceMixtureList

    monkeypatch.setenv("OLMO_DATA_PREP_WORKERS", "1")
    length = 64
    sources = SourceMixtureList(sources=[SourceMixtureConfig(**s) for s in trainer_mix(dataset, "olmo")["sources"]])
    mixture = SourceMixtureDatasetConfig(
        source_list=sources,
        requested_tokens=400_000,
        global_batch_size=4 * length,
        seed=7,
        render_tables=False,
        quiet=True,
    )
    config = NumpyFSLDatasetConfig.from_src_mix(
        mixture,
        tokenizer=TokenizerConfig(vocab_size=VOCAB, eos_token_id=EOD, pad_token_id=EOD),
        sequence_length=length,
        work_dir=str(tmp_path / "work"),
    )
    instances = config.build()
    instances.prepare()
    owner = owners(dataset, length)
    drawn = (instances[i]["input_ids"].numpy().astype(np.int64).tobytes() for i in range(len(instances)))
    assert_drawn_in_shares(collections.Counter(owner[window] for window in drawn), dataset)


@pytest.mark.trainers
def test_the_litgpt_pages_snippets_stream_a_source_and_the_mix(dataset, tmp_path, monkeypatch):
    """docs/train-litgpt.md's two snippets as they are: a source's blocks of 2,049 tokens, and the mix's."""
    monkeypatch.setenv("DATA_OPTIMIZER_CACHE_FOLDER", str(tmp_path / "cache"))
    single, mixed = page_blocks("docs/train-litgpt.md")
    train = run_python(single, {"/data/web/<version>/litdata/train": str(dataset / "litdata" / "wiki" / "train")})
    assert len(train["train"]) == len(windows(dataset, "wiki/train", 2049)) > 0
    assert len(next(iter(run_python(mixed, {"/data/mix/<version>": str(dataset)})["train"]))) == 2049


@pytest.mark.trainers
def test_the_olmo_core_pages_snippets_read_a_source_and_the_mix(dataset, tmp_path, monkeypatch):
    """docs/train-olmo-core.md's two snippets as they are (prepared before their first index), on the wiki source's
    training files and on the mix, asked for fewer tokens than the page's 10**10 (the test corpus holds ~1M)."""
    monkeypatch.setenv("OLMO_DATA_PREP_WORKERS", "1")
    single, mixed = page_blocks("docs/train-olmo-core.md")
    work = {"/tmp/olmo-work": str(tmp_path / "work")}
    loaded = run_python(single, {"/data/web/<version>/olmo/train": str(dataset / "olmo" / "wiki" / "train"), **work})
    assert np.array_equal(loaded["first"].numpy(), windows(dataset, "wiki/train", 2048)[0])
    assert len(loaded["documents"]) == len(documents(dataset, "wiki/train"))
    fewer = {"requested_tokens=10**10": "requested_tokens=400_000", "512 * 2048": "4 * 2048"}
    mix = run_python(mixed, {"/data/mix/<version>": str(dataset), **work, **fewer})["dataset"]
    assert len(mix[0]["input_ids"]) == 2048


@pytest.fixture
def streaming(tmp_path, monkeypatch):
    """`streaming`, whose `import` imports its vision datasets and so torchvision: PyPI's torchvision for torch
    2.13 is a CUDA build that fails on the CPU torch (`operator torchvision::nms does not exist`), and `make
    trainers` leaves it out; text never uses it, so the two names streaming imports from it are stood in for.
    Its datasets make two lock files each in the temporary directory and leave them (`/tmp/000006_barrier_filelock`,
    ...): the test's own, here."""
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

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return streaming


@pytest.mark.streaming
def test_llm_foundry_reads_mds_rows_of_seq_len(dataset, streaming):
    """streaming's `StreamingDataset` over a stream's MDS shards, each sample decoded as llm-foundry's
    `StreamingTextDataset._read_binary_tokenized_sample` does (its `tokens` column, cut to max_seq_len, as int64):
    rows of pack.seq_len tokens of the documents joined by their EOD, that never cross a shard."""
    import torch

    for stream in STREAMS:
        rows = streaming.StreamingDataset(local=str(dataset / "mds" / stream), shuffle=False, batch_size=1)
        expected = windows(dataset, stream, SEQ_LEN)
        assert len(rows) == len(expected) > 0
        for i, row in enumerate(expected):
            sample = torch.from_numpy(rows[i]["tokens"][:SEQ_LEN].copy()).to(torch.int64)  # llm-foundry's decoding
            assert np.array_equal(sample.numpy(), row)


@pytest.mark.streaming
def test_streaming_draws_each_stream_in_its_proportion(dataset, streaming):
    """llm-foundry's `streams` from the mix, each with its `proportion`: an epoch of 5,000 rows holds each source's
    within 1% of its share."""
    streams = [streaming.Stream(**spec) for spec in trainer_mix(dataset, "mds")["streams"].values()]
    rows = streaming.StreamingDataset(streams=streams, epoch_size=5000, shuffle=True, shuffle_seed=3, batch_size=1)
    owner = owners(dataset, SEQ_LEN)
    assert_drawn_in_shares(
        collections.Counter(owner[row["tokens"].astype(np.int64).tobytes()] for row in rows), dataset
    )


@pytest.mark.streaming
def test_the_llm_foundry_pages_snippet_reads_a_sources_rows(dataset, streaming):
    """docs/train-llm-foundry.md's snippet as it is, on the wiki source's MDS rows (of this run's seq_len)."""
    (snippet,) = page_blocks("docs/train-llm-foundry.md")
    tokens = run_python(snippet, {"/data/web/<version>/mds/train": str(dataset / "mds" / "wiki" / "train")})["tokens"]
    assert len(tokens) == SEQ_LEN
