"""Publishing to a real S3-protocol server (moto, on 127.0.0.1): versioned prefix, manifest last, LATEST,
re-publish copies nothing, an interrupted publish is completed, `inspect --verify` catches damage, and
credentials given in the config appear nowhere; and locally, a publish killed mid-copy leaves no temporary file
in the version once it is rerun."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import boto3
import pytest

SECRET = "s3cr3t-that-must-never-be-printed"


@pytest.fixture(scope="module")
def s3(s3_server):
    client = boto3.client("s3")
    client.create_bucket(Bucket="datasets")
    return client


def objects(s3, prefix: str) -> dict[str, object]:
    listing = s3.list_objects_v2(Bucket="datasets", Prefix=prefix).get("Contents", [])
    return {o["Key"].removeprefix(prefix): o["LastModified"] for o in listing}


@pytest.fixture(scope="module")
def published(run_cli, s3, gpt2_run, tmp_path_factory):
    """gpt2_run's build published to s3://datasets/root with credentials in the config, and a server-side
    copy of what was published under pristine/ for the tests that damage it."""
    build = tmp_path_factory.mktemp("publish") / "build"
    shutil.copytree(gpt2_run, build)  # the shards are reused: this run builds nothing, it publishes
    run = [
        "run", "examples/gpt2.yaml", "--set", f"output.path={build}", "--set", "partition.shard_size=1MB",
        "--set", "output.publish.path=s3://datasets/root", "--set", "output.publish.storage.key=testing",
        "--set", f"output.publish.storage.secret={SECRET}",
    ]  # fmt: skip
    first = run_cli(*run)
    for key in objects(s3, "root/"):
        s3.copy_object(
            Bucket="datasets", Key=f"pristine/{key}", CopySource={"Bucket": "datasets", "Key": f"root/{key}"}
        )
    return build, run, first


def test_publish_republish_interrupted_and_verify(run_cli, s3, published):
    build, run, first = published
    manifest = json.loads((build / "manifest.json").read_text())
    version, files = manifest["version"], manifest["files"]
    prefix = f"root/demo-gpt2/{version}/"
    assert f"s3://datasets/{prefix.rstrip('/')}" in first.stdout and f"{len(files)} files copied" in first.stdout
    published = objects(s3, prefix)
    assert {f["path"] for f in files} | {"manifest.json", "report/summary.md"} <= set(published)
    assert s3.get_object(Bucket="datasets", Key="root/demo-gpt2/LATEST")["Body"].read().decode().strip() == version
    remote_manifest = json.loads(s3.get_object(Bucket="datasets", Key=prefix + "manifest.json")["Body"].read())
    assert remote_manifest == manifest

    verified = run_cli("inspect", "s3://datasets/root/demo-gpt2", "--verify")
    assert f"verified: all {len(files)} files match the manifest" in verified.stdout

    # the same input and config again: the version is published, so nothing is copied or rewritten
    before = objects(s3, "root/")
    again = run_cli(*run)
    assert "Nothing to do" in again.stdout and "0 files copied" in again.stdout
    assert objects(s3, "root/") == before

    # a publish interrupted halfway: no manifest, some files missing; the next run completes it
    lost = [f["path"] for f in files if f["kind"] == "megatron-bin"][:3]
    for key in ["manifest.json", *lost]:
        s3.delete_object(Bucket="datasets", Key=prefix + key)
    s3.delete_object(Bucket="datasets", Key="root/demo-gpt2/LATEST")
    incomplete = run_cli("inspect", f"s3://datasets/{prefix}", check=False)
    assert incomplete.returncode == 1 and "no manifest.json" in incomplete.stdout
    completed = run_cli(*run)
    assert f"3 files copied, {len(files) - 3} already there" in completed.stdout
    assert "verified" in run_cli("inspect", "s3://datasets/root/demo-gpt2", "--verify").stdout

    # the secret given in the config is nowhere: output, manifest, report, recorded run config
    recorded = [first.stdout, first.stderr, again.stdout, (build / "_work/config.json").read_text()]
    recorded += [
        s3.get_object(Bucket="datasets", Key=prefix + k)["Body"].read().decode()
        for k in ("manifest.json", "report/summary.md")
    ]
    assert not any(SECRET in text for text in recorded)


@pytest.mark.parametrize(
    "case, damage, message",
    [
        ("flip", "megatron/train/shard-00001.idx", "megatron/train/shard-00001.idx: sha256 differs"),
        ("truncate", "megatron/train/shard-00000.bin", "megatron/train/shard-00000.bin: "),
        ("delete", "packed/train/shard-00002.tokens.npy", "packed/train/shard-00002.tokens.npy: missing"),
    ],
)
def test_inspect_verify_names_the_damaged_file(run_cli, s3, published, case, damage, message):
    pristine = "pristine/demo-gpt2/"
    for key in objects(s3, pristine):
        s3.copy_object(Bucket="datasets", Key=f"{case}/demo-gpt2/{key}",
                       CopySource={"Bucket": "datasets", "Key": pristine + key})  # fmt: skip
    version = s3.get_object(Bucket="datasets", Key=f"{case}/demo-gpt2/LATEST")["Body"].read().decode().strip()
    key = f"{case}/demo-gpt2/{version}/{damage}"
    data = s3.get_object(Bucket="datasets", Key=key)["Body"].read()
    if case == "flip":
        s3.put_object(Bucket="datasets", Key=key, Body=data[:40] + bytes([data[40] ^ 0xFF]) + data[41:])
    elif case == "truncate":
        s3.put_object(Bucket="datasets", Key=key, Body=data[:-2])
    else:
        s3.delete_object(Bucket="datasets", Key=key)
    assert "verified" in run_cli("inspect", f"s3://datasets/{pristine}", "--verify").stdout
    result = run_cli("inspect", f"s3://datasets/{case}/demo-gpt2", "--verify", check=False)
    assert result.returncode == 1 and message in result.stdout


def test_a_publish_killed_mid_copy_leaves_no_temporary_file_in_the_version(run_cli, gpt2_run, tmp_path):
    """A process killed while it copies a file into a version leaves that file's temporary copy; the rerun's
    publish removes it, so the version holds exactly what its manifest lists, its report and a single input's Megatron
    data-args files (which name where the version lies, not what it holds)."""
    out = tmp_path / "out"
    shutil.copytree(gpt2_run, out)
    version = json.loads((out / "manifest.json").read_text())["version"]
    published = out / "demo-gpt2" / version
    (published / "manifest.json").unlink()  # killed before the manifest: the version is incomplete
    litter = published / "megatron/train/.shard-00001.bin.tmp-0badc0de"
    litter.write_bytes(b"half a shard")
    run_cli("run", "examples/gpt2.yaml", "--set", f"output.path={out}", "--set", "partition.shard_size=1MB")
    assert not litter.exists()
    listed = {f["path"] for f in json.loads((published / "manifest.json").read_text())["files"]}
    on_disk = {str(p.relative_to(published)) for p in published.rglob("*") if p.is_file()}
    beside = {"manifest.json", "megatron/train.args", "megatron/per_split.json"}
    assert {path for path in on_disk - listed if not path.startswith("report/")} == beside


def test_threaded_work_keeps_its_results_in_order_and_only_a_few_items_ahead():
    """Publishing hashes and copies files on threads; at 500,000 files a future per file cost 0.5 GB."""
    from tokenmill.io.storage import HASH_THREADS, threaded

    taken = 0

    def items():
        nonlocal taken
        for i in range(1000):
            taken += 1
            yield i

    ahead = []
    for done, result in enumerate(threaded(lambda i: i * i, items())):
        assert result == done * done
        ahead.append(taken - done)
    assert max(ahead) <= 4 * HASH_THREADS + 1 and len(ahead) == 1000


def test_a_streamed_list_is_written_as_the_whole_would_be(tmp_path):
    """The manifest's file list (and stats.json's rows) are written an item at a time, never held whole: the bytes
    are those that writing the whole object gives, wherever the list sits, and when it is empty."""
    from tokenmill.io.storage import STREAMED, Store

    store = Store(tmp_path)
    items = [{"path": "a/b.bin", "shard": 1, "split": None, "nested": {"x": [1, 2]}}, {}, {"text": 'é\n"}'}]
    for rows in (items, []):
        for streamed, whole in [
            ({"name": "x", "files": STREAMED, "z": {"k": 1}}, {"name": "x", "files": rows, "z": {"k": 1}}),
            ({"a": {"b": STREAMED}}, {"a": {"b": rows}}),
            (STREAMED, rows),
        ]:
            store.write_json("streamed.json", streamed, iter(rows))
            store.write_json("whole.json", whole)
            assert (tmp_path / "streamed.json").read_bytes() == (tmp_path / "whole.json").read_bytes()


def test_spooled_files_are_the_manifests_in_its_order_with_their_sizes_and_digests(gpt2_run):
    """The file list is spooled to disk as the markers are read and listed, merged, in the manifest's order: path
    order, each file with its size and the sha256 of its bytes, as often as asked; the spool goes on close."""
    import pandas as pd

    from tokenmill.io.storage import Store
    from tokenmill.stages.publish import Files, spool_files

    store = Store(gpt2_run)
    table = pd.DataFrame(json.loads((gpt2_run / "stats.json").read_text()))
    with Files() as files:
        spool_files(store, table, files)
        entries = list(files.entries())
        assert list(files.entries()) == entries
        spool = Path(files.directory.name)
        assert len(list(spool.iterdir())) > 2  # a spool per directory of shard files, and one for the others
    assert not spool.exists()
    manifest = json.loads((gpt2_run / "manifest.json").read_text())["files"]
    assert entries == [{k: f[k] for k in ("path", "bytes", "sha256")} for f in manifest]
    paths = [e["path"] for e in entries]
    assert paths == sorted(paths) and len(files) == len(paths) > 20
    assert all(store.digest(e["path"]) == {"bytes": e["bytes"], "sha256": e["sha256"]} for e in entries)


def test_files_past_shard_99999_are_listed_in_path_order(tmp_path):
    """Shard names grow a digit at 100,000 ("shard-100000" sorts before "shard-10001"): the markers are read in the
    order of the shards' names, so each directory's spool is in path order, and a file out of order is an error,
    never a silently unsorted manifest."""
    import pandas as pd

    from tokenmill.core import layout
    from tokenmill.core.commits import commit
    from tokenmill.io.storage import Store
    from tokenmill.stages.publish import Files, spool_files

    store = Store(tmp_path)
    store.write_bytes(layout.PLAN, b"{}")
    store.write_bytes(layout.TOKENIZER, b"{}")
    store.write_bytes(layout.STATS, b"[]")
    ids = [9999, 10000, 10001, 99999, 100000, 100001]
    for shard_id in ids:
        prefix = layout.megatron_prefix("train", shard_id)
        recorded = {f"{prefix}.{ext}": {"bytes": shard_id, "sha256": ext * 8} for ext in ("bin", "docs.parquet", "idx")}
        commit(store, "tokenize", shard_id, "key", {}, recorded)
    row = {"documents": 1, "packed_rows": 0, "llmc_files": 0, "rejected": 0, "split": "train",
           "supervised_tokens": -1, "trainer_files": 0}  # fmt: skip
    table = pd.DataFrame([{"shard_id": shard_id, **row} for shard_id in ids])
    with Files() as files:
        spool_files(store, table, files)
        paths = [e["path"] for e in files.entries()]
    assert paths == sorted(paths) and len(paths) == 3 * len(ids) + 3
    with Files() as files, pytest.raises(RuntimeError, match="shard-100000.bin after megatron/train/shard-10001.bin"):
        files.add("megatron/train", "megatron/train/shard-10001.bin", {"bytes": 1, "sha256": "0"})  # numeric order
        files.add("megatron/train", "megatron/train/shard-100000.bin", {"bytes": 1, "sha256": "0"})


def test_a_commit_marker_that_does_not_list_a_shards_files_stops_publish_naming_the_shard(gpt2_run, tmp_path):
    """The manifest's shard files are the ones their commit markers recorded; a marker listing fewer (or more)
    than the validated stats name stops publish, naming the shard, before anything is written."""
    import pandas as pd

    from tokenmill.core.commits import commit
    from tokenmill.core.stats import ValidationFailed
    from tokenmill.io.storage import Store
    from tokenmill.stages.publish import Files, spool_files

    out = tmp_path / "copy"
    shutil.copytree(gpt2_run, out)
    table = pd.DataFrame(json.loads((out / "stats.json").read_text()))
    done = json.loads((out / "_commits" / "tokenize" / "shard-00001.json").read_text())
    done["files"].pop(sorted(done["files"])[0])
    commit(Store(out), "tokenize", 1, done["key"], done["result"], done["files"])  # signed: as tokenmill wrote it
    match = r"shard 00001 \((\d+) files recorded, (?!\1)\d+ in the stats\)"
    with Files() as files, pytest.raises(ValidationFailed, match=match):
        spool_files(Store(out), table, files)


def test_a_manifest_is_read_less_its_files_which_are_counted(gpt2_run, tmp_path):
    """A run over an already published version reads its manifest without the list of files (at 490,000 files,
    0.4 GB as dicts): the rest as it is, and the number of files; laid out otherwise, it is read whole."""
    from tokenmill.io.storage import Store
    from tokenmill.stages.publish import FILES_LISTED, manifest_less_files

    manifest = json.loads((gpt2_run / "manifest.json").read_text())
    less = {k: v for k, v in manifest.items() if k != "files"} | {FILES_LISTED: len(manifest["files"])}
    assert manifest_less_files(Store(gpt2_run)) == less and less[FILES_LISTED] > 20
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))  # one line
    assert manifest_less_files(Store(tmp_path)) == less
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "files": []}, indent=2))
    assert manifest_less_files(Store(tmp_path)) == less | {FILES_LISTED: 0}
