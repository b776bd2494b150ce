"""Where each token came from (docs/outputs.md, the documents table): one run of a mixture of a JSONL file cut into
several shards (its pieces after the first start mid-file; OLMo's layout names each document's line, so the partition
counts the lines at the cuts), a Parquet file of several row groups and a gzipped JSONL file, with metadata fields
carried, and one run of the JSONL file alone whose partition does not count them (they are numbered once the
tokenize stage is done). From random token positions in every split's `.bin`, the table leads to the exact input line
or row, whose text re-encodes to those tokens; `inspect --doc` and the packed loader say the same."""

from __future__ import annotations

import csv
import functools
import gzip
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from tokenmill.core import layout
from tokenmill.core.stats import COLUMNS
from tokenmill.formats.megatron import MegatronReader
from tokenmill.io.storage import Store
from tokenmill.loader import PackedSplit
from tokenmill.stages.validate import Checking, ShardFiles, check_shard

from .conftest import EXAMPLES

EOD = 50256  # GPT-2's <|endoftext|>, after every document
VOCAB = 50257
SEQ_LEN = 128
TOKENIZER = EXAMPLES / "tokenizers" / "gpt2" / "tokenizer.json"
METADATA = {"wiki": [], "web": ["dclm_label"], "news": ["url"]}  # dclm_label is a number: carried as its JSON text


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Each source's input file: wikitext as it is (1.3 MB: several 200 KB shards), the DCLM sample as Parquet in row
    groups of 40 rows, the news sample gzipped as it is."""
    root = tmp_path_factory.mktemp("provenance-inputs")
    wiki = root / "wikitext2_raw_test.jsonl"
    shutil.copy(EXAMPLES / "data" / wiki.name, wiki)
    with gzip.open(EXAMPLES / "data" / "web_dclm_annotated.jsonl.gz") as f:
        records = [json.loads(line) for line in f]
    web = root / "web_dclm.parquet"
    pq.write_table(pa.Table.from_pylist(records), web, row_group_size=40)
    return {"wiki": wiki, "web": web, "news": EXAMPLES / "data" / "web_scrapinghub_aeb.jsonl.gz"}


@pytest.fixture(scope="module")
def dataset(run_cli, inputs, tmp_path_factory) -> Path:
    """The three sources mixed, in 200 KB shards, train and val, with OLMo's layout: the published version's
    directory."""
    root = tmp_path_factory.mktemp("provenance")
    sources = [
        {
            "name": name,
            "input": {"paths": [str(path)], "id_field": "id", "metadata_fields": METADATA[name]},
            "weight": 1.0,
        }
        for name, path in inputs.items()
    ]
    config = {
        "name": "provenance",
        "sources": sources,
        "partition": {"shard_size": "200KB"},
        "split": {"train": 0.8, "val": 0.2},
        "tokenizer": {"path": str(TOKENIZER)},
        "pack": {"mode": "concat", "seq_len": SEQ_LEN},
        "mix": {"max_epochs": 100},
        "output": {"path": str(root / "build"), "formats": ["megatron", "packed", "olmo"]},
    }
    (root / "provenance.yaml").write_text(json.dumps(config))
    run_cli("run", str(root / "provenance.yaml"))
    published = root / "build" / "provenance"
    return published / (published / "LATEST").read_text().strip()


@pytest.fixture(scope="module")
def uncounted(run_cli, inputs, tmp_path_factory) -> Path:
    """The JSONL file alone in 200 KB shards, train and val by its ids, Megatron's layout: nothing needs the lines
    at the cuts, so the partition leaves them uncounted. The build's directory."""
    root = tmp_path_factory.mktemp("uncounted")
    config = {
        "name": "uncounted",
        "input": {"paths": [str(inputs["wiki"])], "id_field": "id"},
        "partition": {"shard_size": "200KB"},
        "split": {"train": 0.8, "val": 0.2},
        "tokenizer": {"path": str(TOKENIZER)},
        "output": {"path": str(root / "build"), "formats": ["megatron"]},
    }
    (root / "uncounted.yaml").write_text(json.dumps(config))
    run_cli("run", str(root / "uncounted.yaml"))
    return root / "build"


def tables(root: Path) -> dict[str, Path]:
    """Every documents table the manifest lists, by its path."""
    manifest = json.loads((root / "manifest.json").read_text())
    return {f["path"]: root / f["path"] for f in manifest["files"] if f["kind"] == "documents-table"}


def input_record(file: str, line: int) -> dict:
    """The record at `line` of a JSONL file (or row `line` of a Parquet file), read as a person would."""
    return input_records(file)[line - 1]


@functools.cache
def input_records(file: str) -> list:
    """A Parquet file's rows, or a JSONL file's records by line (None where a line is blank)."""
    if file.endswith(".parquet"):
        return pq.read_table(file).to_pylist()
    with (gzip.open if file.endswith(".gz") else open)(file, "rb") as f:
        return [json.loads(line) if line.strip() else None for line in f.read().split(b"\n")]


def as_text(value) -> str | None:
    """A metadata value as the table holds it."""
    return value if value is None or isinstance(value, str) else json.dumps(value)


def test_a_random_token_leads_back_to_its_exact_input_line(dataset, inputs):
    """For random token positions of every shard's split `.bin`: the table row whose offset and length hold it names
    a file and line whose record has the row's id and metadata, and whose text, encoded with EOD, is exactly the
    row's tokens. Every kind of input is walked back so: a piece cut mid-file, Parquet, gzipped JSONL."""
    tokenizer, rng = Tokenizer.from_file(str(TOKENIZER)), np.random.default_rng(7)
    walked = set()
    for rel, path in tables(dataset).items():
        table = pq.read_table(path).to_pylist()
        reader = MegatronReader(dataset / rel.removesuffix(".docs.parquet"))
        ends = np.array([r["token_offset"] + r["token_length"] for r in table])
        for position in rng.integers(0, len(reader.tokens), 5):
            row = table[int(np.searchsorted(ends, position, side="right"))]
            assert row["token_offset"] <= position < row["token_offset"] + row["token_length"]
            record = input_record(row["file"], row["line"])
            assert record["id"] == row["id"] and row["split"] == rel.split("/", 1)[1].rsplit("/", 1)[0]
            tokens = reader.tokens[row["token_offset"] : row["token_offset"] + row["token_length"]]
            assert tokens.tolist() == [*tokenizer.encode(record["text"]).ids, EOD]
            assert all(row[name] == as_text(record[name]) for name in METADATA[row["source"]])
            walked.add(row["source"])
    assert walked == set(inputs)  # every shard's every split: wikitext's pieces cut mid-file among them


def test_pieces_cut_mid_file_are_numbered_by_their_line_in_the_file(uncounted, inputs):
    """The plan left the first line of the file's later pieces uncounted; each such shard's tables start at the line
    of the piece's first byte, counted in the file."""
    plan = json.loads((uncounted / layout.PLAN).read_text())
    data = inputs["wiki"].read_bytes()
    cut = [s for s in plan["shards"] if s["pieces"][0]["path"] == str(inputs["wiki"])]
    unnumbered = [s for s in cut if s["pieces"][0]["first_line"] is None]
    assert len(cut) >= 3 and len(unnumbered) == len(cut) - 1
    for shard in unnumbered:
        start = shard["pieces"][0]["start"]
        lines = [
            line
            for split in ("train", "val")
            if (path := uncounted / layout.documents_table(split, shard["shard_id"])).exists()
            for line in pq.read_table(path, columns=["line"]).column("line").to_pylist()
        ]
        assert min(lines) == data[:start].count(b"\n") + 1


def test_every_table_is_in_the_manifest_and_inspect_verifies_it(dataset, run_cli):
    """A table beside every split of every shard, a row per document of its `.idx`, listed with its kind, split
    and shard; `inspect --verify` checks them with the rest."""
    manifest = json.loads((dataset / "manifest.json").read_text())
    listed = {f["path"]: f for f in manifest["files"]}
    bins = [rel for rel, f in listed.items() if f["kind"] == "megatron-bin"]
    assert bins and set(tables(dataset)) == {rel.removesuffix(".bin") + ".docs.parquet" for rel in bins}
    for rel in tables(dataset):
        entry = listed[rel]
        assert entry["split"] == rel.split("/", 1)[1].rsplit("/", 1)[0] and rel.endswith(
            f"{entry['shard']:05d}.docs.parquet"
        )
        idx = MegatronReader(dataset / rel.removesuffix(".docs.parquet")).index
        assert pq.read_metadata(dataset / rel).num_rows == len(idx)
    said = run_cli("inspect", str(dataset), "--verify").stdout
    assert f"verified: all {len(manifest['files'])} files match the manifest" in said


def test_validate_names_a_damaged_documents_table(dataset, tmp_path):
    """validate's check of a shard's files: a table missing a row, or one that is not Parquet, is named."""
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    shard = next(int(rel[-len("00000.docs.parquet") :][:5]) for rel in tables(copy) if "/train/" in rel)
    rows = [r for r in json.loads((copy / layout.STATS).read_text()) if r["shard_id"] == shard]
    check = Checking(Store(str(copy)), VOCAB, None, EOD, None, EOD, None, (), SEQ_LEN)

    def problems() -> list[str]:
        return check_shard(check, ShardFiles(shard, [{k: r[k] for k in COLUMNS} for r in rows]))

    assert problems() == []
    train, val = (layout.documents_table(r["split"], shard) for r in sorted(rows, key=lambda r: r["split"]))
    table = pq.read_table(copy / train)
    pq.write_table(table.slice(1), copy / train)
    (copy / val).write_bytes(b"not parquet")
    found = "\n".join(problems())
    assert f"{train}: {len(table) - 1} rows, the .idx has {len(table)} documents" in found
    assert f"{val}: not a documents table" in found


def test_inspect_doc_prints_the_origin_and_the_decoded_text(dataset, run_cli):
    """`inspect --doc ID`: the document's file and line (a Parquet file's row), source, split, shard and tokens'
    place, its metadata fields, and its text decoded from its tokens (EOD shown); an unknown id is an error."""
    for source, where in (("news", "line"), ("web", "row")):
        rel, path = next((r, p) for r, p in tables(dataset).items() if r.startswith(f"megatron/{source}/"))
        row = pq.read_table(path).to_pylist()[-1]
        record = input_record(row["file"], row["line"])
        said = run_cli("inspect", str(dataset), "--doc", row["id"]).stdout
        assert f"document {row['id']} of source {source}\n  from {row['file']}, {where} {row['line']}\n" in said
        end = row["token_offset"] + row["token_length"]
        assert (
            f"split {row['split']}, shard-{int(rel[-18:-13]):05d}: tokens {row['token_offset']:,} to {end:,} " in said
        )
        assert all(f"\n  {name}: {as_text(record[name])}\n" in said for name in METADATA[source])
        assert f"  text:\n{record['text']}<|endoftext|>" in said
    missing = run_cli("inspect", str(dataset), "--doc", "no-such-id", check=False)
    assert missing.returncode == 1 and "no document with id 'no-such-id'" in missing.stdout


def test_the_loader_hands_each_sample_with_the_origin_of_its_documents(dataset):
    """`PackedSplit(with_origin=True)` over the mix: each sample's `origin` names, in row order, the documents whose
    pieces fill the row; each one's input line re-encodes to the tokens the row holds of it."""
    tokenizer, rng = Tokenizer.from_file(str(TOKENIZER)), np.random.default_rng(3)
    split = PackedSplit(dataset, "train", with_origin=True)
    sources = set()
    for i in rng.choice(len(split), 30, replace=False):
        sample = split[int(i)]
        filled = 0
        for piece in sample["origin"]:
            assert piece["row_start"] == filled
            record = input_record(piece["file"], piece["line"])
            assert record["id"] == piece["id"] and layout.shard_name(piece["shard"])
            encoded = [*tokenizer.encode(record["text"]).ids, EOD][piece["document_start"] :][: SEQ_LEN - filled]
            assert sample["input_ids"][filled : filled + len(encoded)].tolist() == encoded
            filled += len(encoded)
            sources.add(piece["source"])
        assert filled == int(sample["cu_seqlens"][-1]) or filled == SEQ_LEN
    assert sources == set(METADATA)
    with pytest.raises(ValueError, match="with_origin needs rows packed by concat"):
        bfd = dataset.parent / "bfd"
        shutil.copytree(dataset, bfd)
        manifest = json.loads((bfd / "manifest.json").read_text())
        manifest["config"]["pack"]["mode"] = "bfd"
        (bfd / "manifest.json").write_text(json.dumps(manifest))
        PackedSplit(bfd, "train", with_origin=True)


def test_a_single_input_s_documents_name_no_source_and_their_own_line(gpt2_run):
    """examples/gpt2.yaml, one input of three files: every document's row names source "", and the file and line
    whose record has its id."""
    rows = [row for table in gpt2_run.glob("megatron/*/*.docs.parquet") for row in pq.read_table(table).to_pylist()]
    manifest = json.loads((gpt2_run / "manifest.json").read_text())
    assert len(rows) == manifest["counts"]["documents_out"]
    assert all(row["source"] == "" and input_record(row["file"], row["line"])["id"] == row["id"] for row in rows)


def test_olmo_s_documents_name_each_document_s_input_file_and_line(dataset):
    """OLMo's `.csv.gz` beside each `.npy` is dolma's `start,end,id,src,loc`: the documents table's offsets, id, file
    and line, row for row, as the pack stage wrote it (its marker's sha256): the partition counted the line at each
    cut of the JSONL file, so no later step writes it again."""
    build = dataset.parent.parent
    plan = json.loads((build / layout.PLAN).read_text())
    cut = [s["pieces"][0] for s in plan["shards"] if s["pieces"][0]["path"].endswith(".jsonl")]
    assert len(cut) >= 3 and all(piece["first_line"] for piece in cut)
    packed = {rel: f["sha256"] for marker in (build / "_commits" / "pack").glob("*.json")
              for rel, f in json.loads(marker.read_text())["files"].items() if rel.endswith(".csv.gz")}  # fmt: skip
    for rel, path in tables(dataset).items():
        split, shard = rel.removeprefix("megatron/").rsplit("/", 1)
        _, documents = layout.trainer_files("olmo", split, int(shard[len("shard-") : len("shard-") + 5]))
        with gzip.open(dataset / documents, "rt") as f:
            rows = list(csv.reader(f))
        expected = [
            [str(r["token_offset"]), str(r["token_offset"] + r["token_length"]), r["id"], r["file"], str(r["line"])]
            for r in pq.read_table(path).to_pylist()
        ]
        assert rows == expected
        assert packed[documents] == hashlib.sha256((dataset / documents).read_bytes()).hexdigest()
