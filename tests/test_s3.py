"""Input read from and the dataset written to a real S3-protocol server (moto, on 127.0.0.1)."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import zstandard

from .conftest import EXAMPLES


def test_flow_reads_and_writes_s3(run_cli, s3_server, gpt2_run):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="corpus")
    s3.create_bucket(Bucket="datasets")
    for path in (EXAMPLES / "data").glob("*.jsonl*"):
        s3.upload_file(str(path), "corpus", f"demo/{path.name}")
    s3.put_object(Bucket="corpus", Key="demo/README.md", Body=b"# not a document\n")  # the prefix names its data

    local = gpt2_run  # the same config, read and written locally
    run_cli(
        "run", "examples/gpt2.yaml", "--set", "partition.shard_size=1MB",
        "--set", "input.paths=[s3://corpus/demo/]", "--set", "output.path=s3://datasets/gpt2",
    )  # fmt: skip

    manifest = json.loads(s3.get_object(Bucket="datasets", Key="gpt2/manifest.json")["Body"].read())
    local_manifest = json.loads((local / "manifest.json").read_text())
    assert manifest["counts"] == local_manifest["counts"]
    # The plan and the documents tables name the input files where they were read; the rest is the same
    named = ("plan", "documents-table")
    remote_files = {f["path"]: f["sha256"] for f in manifest["files"] if f["kind"] not in named}
    local_files = {f["path"]: f["sha256"] for f in local_manifest["files"] if f["kind"] not in named}
    assert remote_files == local_files  # the same tokens, byte for byte, wherever they were read and written
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket="datasets", Prefix="gpt2/")["Contents"]}
    assert {f"gpt2/{p}" for p in remote_files} <= listed
    tables = [f["path"] for f in local_manifest["files"] if f["kind"] == "documents-table"]
    assert tables == [f["path"] for f in manifest["files"] if f["kind"] == "documents-table"]
    for rel in tables:
        remote = pq.read_table(io.BytesIO(s3.get_object(Bucket="datasets", Key=f"gpt2/{rel}")["Body"].read()))
        expected = pq.read_table(local / rel).to_pylist()
        for row in expected:
            row["file"] = f"s3://corpus/demo/{Path(row['file']).name}"
        assert remote.to_pylist() == expected


def test_a_json_array_file_on_s3_is_read_as_on_disk(s3_server, tmp_path):
    """An object store's file has no peek: whether a .json object holds one array is read from its start and the
    read sought back. Its records, plain or gzipped, are the local file's; the partition cuts the plain one at its
    records, as on disk, and each piece read from the store alone holds its records."""
    from tokenmill.config import TokenmillConfig
    from tokenmill.io.readers import Piece, ReadOptions, read_documents
    from tokenmill.stages.partition import plan_shards

    records = [{"text": f"record {i}\n" + "x" * (i * 31 % 200)} for i in range(300)]
    data = json.dumps(records, indent=2).encode()
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="arrays")
    s3.put_object(Bucket="arrays", Key="a.json", Body=data)
    s3.put_object(Bucket="arrays", Key="b.json.gz", Body=gzip.compress(data))
    for key in ("a.json", "b.json.gz"):
        for columnar in (False, True):
            read = list(read_documents([Piece(f"s3://arrays/{key}")], ReadOptions(), columnar))
            assert [str(t) for batch, _ in read for t in batch.text_values()] == [r["text"] for r in records]
            assert not any(rejects for _, rejects in read)
    config = TokenmillConfig.model_validate(
        {"name": "t", "input": {"paths": ["s3://arrays/a.json"]}, "partition": {"shard_size": 4000},
         "tokenizer": {"path": "unused.json"}, "output": {"path": str(tmp_path / "out")}}
    )  # fmt: skip
    shards = plan_shards(config).shards
    assert len(shards) > 5 and all(data[s.pieces[0].start - 1] == ord(",") for s in shards[1:])
    batches = [batch for s in shards for batch, _ in read_documents(s.pieces, ReadOptions(), True)]
    assert [str(t) for batch in batches for t in batch.text_values()] == [r["text"] for r in records]
    assert [i for batch in batches for i in batch.ids] == [f"a.json:{n}" for n in range(1, 301)]


def test_a_source_tree_on_s3_is_read_as_on_disk_each_file_named_by_its_key_under_the_prefix(s3_server, tmp_path):
    """Text files of one document each under an S3 prefix, a `Makefile` in several "directories" (read 16 at a time
    there, each a request): every document is read once, in the plan's order, its id its key under the prefix the
    glob starts from, as on disk; one not UTF-8 is a reject naming it."""
    from tokenmill.config import TokenmillConfig
    from tokenmill.io.readers import read_documents
    from tokenmill.stages.partition import plan_shards

    files = {f"kernel/d{i % 5}/Makefile": f"obj-y += f{i}.o\n" + "# x\n" * (i % 9) for i in range(60)}
    files |= {f"kernel/d{i % 5}/f{i}.c": f"int f{i};\n" for i in range(60, 100)}
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="tree")
    for key, text in files.items():
        s3.put_object(Bucket="tree", Key=f"linux/{key}", Body=text.encode())
    s3.put_object(Bucket="tree", Key="linux/kernel/latin1.c", Body=b"caf\xe9")
    config = TokenmillConfig.model_validate(
        {"name": "t", "input": {"paths": ["s3://tree/linux/**"], "format": "text"}, "partition": {"shard_size": 400},
         "tokenizer": {"path": "unused.json"}, "output": {"path": str(tmp_path / "out")}}
    )  # fmt: skip
    plan, options = plan_shards(config), config.input.read_options()
    assert len(plan.shards) > 3 and options.root == "s3://tree/linux"
    documents, rejects = {}, []
    for shard in plan.shards:
        for batch, bad in read_documents(shard.pieces, options, columnar=True):
            documents |= dict(zip(batch.ids, map(str, batch.text_values()), strict=True))
            rejects += [(r.file, r.reason) for r in bad]
    assert documents == files and rejects == [("kernel/latin1.c", "invalid UTF-8 at byte 3")]


def test_a_crawls_small_jsonl_parts_on_s3_are_parsed_a_run_at_a_time_as_on_disk(s3_server, tmp_path, monkeypatch):
    """JSON Lines parts of a KB or so under an S3 prefix (one with a bad record, one larger than a batch): read 16 at
    a time, their bytes joined a run of about `batch_bytes` and parsed at once, each file's size told by the store; the
    documents, ids and rejects are the careful reader's, file by file."""
    from tokenmill.config import TokenmillConfig
    from tokenmill.io import readers
    from tokenmill.io.readers import read_documents
    from tokenmill.stages.partition import plan_shards

    parses, parse = [], readers._arrow_table
    monkeypatch.setattr(readers, "_arrow_table", lambda block, options: parses.append(block) or parse(block, options))
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="crawl")
    for i in range(60):
        records = [{"text": f"part {i} page {r} " + "words " * (i % 7)} for r in range(100 if i == 33 else 8)]
        if i == 12:
            records[3] = {"text": None}
        body = "".join(json.dumps(record) + "\n" for record in records)
        s3.put_object(Bucket="crawl", Key=f"cc/{i // 20}/part-{i:03d}.jsonl", Body=body.encode())
    config = TokenmillConfig.model_validate(
        {"name": "t", "input": {"paths": ["s3://crawl/cc"]}, "partition": {"shard_size": 20_000},
         "tokenizer": {"path": "unused.json"}, "output": {"path": str(tmp_path / "out")}}
    )  # fmt: skip
    plan, options = plan_shards(config), config.input.read_options()
    read = {}
    for columnar in (False, True):
        parses.clear()
        batches = [b for shard in plan.shards for b in read_documents(shard.pieces, options, columnar, 3_000)]
        documents = [(i, str(t)) for batch, _ in batches for i, t in zip(batch.ids, batch.text_values(), strict=True)]
        read[columnar] = documents, [(r.file, r.line, r.reason) for _, bad in batches for r in bad]
    joined = [batch for batch, _ in batches if isinstance(batch.block, list) and len(batch.block) > 1]
    alone = sum(len(shard.pieces) == 1 for shard in plan.shards)  # the last few files, each a shard (`_group`)
    grouped = len(plan.shards[0].pieces)
    assert read[True] == read[False] and len(joined) >= 4 and grouped > 30 and len(parses) - alone < 20
    assert not any(piece.path.endswith("part-033.jsonl") for batch in joined for piece in batch.block)  # 5.8 KB
    documents, rejects = read[True]
    assert len(documents) == 59 * 8 + 100 - 1 and ("0/part-000.jsonl:1", "part 0 page 0 ") in documents
    assert rejects == [("0/part-012.jsonl", 4, "text field 'text' missing or null")]


def test_the_sample_of_a_crawls_small_parts_on_s3_opens_only_the_files_it_draws_from(s3_server, tmp_path, monkeypatch):
    """The held-out sample over 300 JSONL parts of about 70 KB under an S3 prefix: each file's size is asked for 16
    at a time, and a file whose drawn block would start past its end is not opened (opening one asks for its size, a
    request each, one after another); the sample is the one that opening every file gives."""
    from tokenmill.config import TokenmillConfig
    from tokenmill.core import samples as sample_files
    from tokenmill.io import readers
    from tokenmill.stages import sampling
    from tokenmill.stages.partition import plan_shards

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="parts")
    for i in range(300):
        body = "".join(json.dumps({"text": f"part {i} page {r} " + "words " * 90}) + "\n" for r in range(120))
        s3.put_object(Bucket="parts", Key=f"cc/part-{i:03d}.jsonl", Body=body.encode())
    config = TokenmillConfig.model_validate(
        {"name": "t", "input": {"paths": ["s3://parts/cc"]}, "partition": {"shard_size": "4MB"},
         "tokenizer": {"path": "unused.json"}, "fertility": {"holdout_size": "200KB"},
         "output": {"path": str(tmp_path / "out")}}
    )  # fmt: skip
    plan = plan_shards(config)
    f, g = sampling.fractions(config, plan)

    def held_out() -> list[str]:
        samples = [sampling.sample_shard(sampling.Sampling.of(config, f, g), shard) for shard in plan.shards]
        return sorted(record["text"] for record in sample_files.holdout_records(config, samples))

    opened, open_piece = set(), readers.open_piece
    monkeypatch.setattr(readers, "open_piece", lambda piece, *a: opened.add(piece.path) or open_piece(piece, *a))
    drawn = held_out()
    assert sampling.stride(f, g) > 20 and 0 < len(opened) < 0.2 * 300 and len(drawn) > 50
    monkeypatch.setattr(sampling, "whole_file_sizes", lambda *_: {})
    config = config.model_copy(update={"output": config.output.model_copy(update={"path": str(tmp_path / "every")})})
    assert held_out() == drawn and len(opened) == 300


def test_the_partition_and_the_samples_read_what_they_look_at_of_an_s3_file_not_a_block_ahead(
    s3_server, tmp_path, monkeypatch
):
    """Finding a line start at each cut reads a line or so there, a .jsonl.zst file's size is read from its first 18
    bytes (and whether a .json.zst holds an array, from its first), a sample's blocks far apart are read each alone,
    and so is a block validate reads again: s3fs reads 50 MB ahead of a read by default, which read this 26 MB file
    whole (and a larger one 50 MB at every cut or block) before the reads were sized."""
    import s3fs

    from tokenmill.config import TokenmillConfig
    from tokenmill.io.readers import Piece, ReadOptions, holds_array, read_documents, sampled_blocks
    from tokenmill.stages import partition
    from tokenmill.stages.partition import plan_shards, uncompressed_size

    lines = b"".join(json.dumps({"text": f"line {i} " + "x" * (i % 300)}).encode() + b"\n" for i in range(150_000))
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="cuts")
    s3.put_object(Bucket="cuts", Key="big.jsonl", Body=lines)
    fetched = []
    fetch = s3fs.S3File._fetch_range
    monkeypatch.setattr(
        s3fs.S3File, "_fetch_range", lambda f, start, end: fetched.append(end - start) or fetch(f, start, end)
    )
    config = TokenmillConfig.model_validate(
        {"name": "t", "input": {"paths": ["s3://cuts/big.jsonl"]}, "partition": {"shard_size": len(lines) // 30},
         "tokenizer": {"path": "unused.json"}, "output": {"path": str(tmp_path / "out")}}
    )  # fmt: skip
    assert len(plan_shards(config).shards) == 31
    assert sum(fetched) < len(lines) / 4, f"{sum(fetched):,} bytes read to cut {len(lines):,}"
    packed = zstandard.ZstdCompressor(level=1).compress(lines)  # records its content size in the frame header
    s3.put_object(Bucket="cuts", Key="big.jsonl.zst", Body=packed)
    fetched.clear()
    assert uncompressed_size("s3://cuts/big.jsonl.zst", len(packed), {}) == len(lines)
    assert sum(fetched) < len(packed) / 4, f"{sum(fetched):,} bytes read for the size of {len(packed):,}"
    s3.put_object(Bucket="cuts", Key="big.json.zst", Body=packed)  # JSON lines named .json: a look at its start
    fetched.clear()
    assert not holds_array(Piece("s3://cuts/big.json.zst"), ReadOptions())
    assert sum(fetched) < len(packed) / 2, f"{sum(fetched):,} bytes read to see whether it holds an array"
    # a sample's blocks far apart (the fertility report's, the encoder's check): the blocks alone, the local file's
    local = tmp_path / "big.jsonl"
    local.write_bytes(lines)
    fetched.clear()
    blocks = list(sampled_blocks(Piece("s3://cuts/big.jsonl"), ReadOptions(), every=100, phase=7))
    assert blocks == list(sampled_blocks(Piece(str(local)), ReadOptions(), every=100, phase=7)) and len(blocks) == 4
    assert sum(fetched) < len(lines) / 4, f"{sum(fetched):,} bytes read for {len(blocks)} blocks"
    # a block the tokenize stage read, read again by validate for its reference sample
    start, stop = partition.cut_offsets(str(local), len(lines), 4, {})[:2]
    fetched.clear()
    ((batch, _),) = read_documents([Piece("s3://cuts/big.jsonl", start, stop, None)], ReadOptions(), True, stop - start)
    ((again, _),) = read_documents([Piece(str(local), start, stop, None)], ReadOptions(), True, stop - start)
    assert batch.text_values() == again.text_values() and len(batch) > 1000
    assert sum(fetched) < 1.1 * (stop - start), f"{sum(fetched):,} bytes read for a block of {stop - start:,}"
