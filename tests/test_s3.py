"""Input read from and the dataset written to a real S3-protocol server (moto, on 127.0.0.1)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import boto3
import pyarrow.parquet as pq

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
