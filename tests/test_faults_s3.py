"""Object-store faults between tokenmill and a real S3-protocol server (moto), injected by a proxy
(tests/fault_proxy.py): resets, 503 SlowDown, 500s, cut-off answers and stalls on reads, writes and listings
are retried and the shards come out byte-identical to a clean build; what cannot be retried fails naming the
object and the cause, within a bound, and leaves nothing committed."""

from __future__ import annotations

import hashlib
import time

import boto3
import orjson
import pytest

from tokenmill.core.layout import marker
from tokenmill.io import storage
from tokenmill.io.storage import StorageError, Store, give_up_s
from tokenmill.stages.partition import load_or_plan
from tokenmill.stages.publish import Files, _copy, publish_version
from tokenmill.stages.train_tokenizer import install_pretrained
from tokenmill.stages.validate import Checking, ReferenceItem, Referencing, check_reference, check_written

from .fault_proxy import FaultProxy
from .test_faults import build, small_config


@pytest.fixture
def proxy(s3_server):
    proxy = FaultProxy(s3_server["AWS_ENDPOINT_URL"], seed=15).start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def bucket(s3_server):
    boto3.client("s3").create_bucket(Bucket="faults")
    return "faults"


def remote_config(tmp_path, proxy, prefix: str):
    config = small_config(tmp_path / "unused")
    config.output.path = f"s3://faults/{prefix}"
    config.output.storage.endpoint_url = proxy.endpoint
    return config


def input_config(tmp_path, proxy, paths: str, shard_size: int, **input_options):
    """A config reading `paths` of the test bucket through the proxy (its output local)."""
    from tokenmill.config import TokenmillConfig

    return TokenmillConfig.model_validate(
        {"name": "t", "input": {"paths": [paths], "storage": {"endpoint_url": proxy.endpoint}, **input_options},
         "partition": {"shard_size": shard_size}, "tokenizer": {"path": "unused.json"},
         "output": {"path": str(tmp_path / "out")}}
    )  # fmt: skip


def objects(store: Store) -> dict[str, bytes]:
    return {rel: store.read_bytes(rel) for rel in store.list() if not rel.startswith(("_commits", "_work"))}


def test_faults_on_every_kind_of_request_are_retried_and_the_shards_are_identical(tmp_path, proxy, bucket, monkeypatch):
    monkeypatch.setenv("TOKENMILL_S3_READ_TIMEOUT", "1")
    clean = remote_config(tmp_path, proxy, "clean")
    build(clean, shard_ids={0, 1})
    proxy.configure(rate=0.25, stall_s=1.5)  # a quarter of all requests fail, of every kind
    faulted = remote_config(tmp_path, proxy, "faulted")
    tokenized, packed = build(faulted, shard_ids={0, 1})
    proxy.configure(rate=0)
    kinds = {kind for kind, _ in proxy.injected}
    assert {"reset", "reset_after", "slowdown", "internal", "stall"} <= kinds, proxy.injected
    assert {method for _, method in proxy.injected} >= {"GET", "PUT", "HEAD"}, proxy.injected
    assert objects(faulted.output.store()) == objects(clean.output.store())
    assert [r.reused for r in tokenized + packed] == [False] * 4


def test_a_write_that_keeps_failing_fails_the_shard_naming_the_object_within_the_bound(tmp_path, proxy, bucket):
    config = remote_config(tmp_path, proxy, "refused")
    build(config, shard_ids=set())  # the plan and tokenizer go in before the store starts refusing writes
    proxy.configure(rate=1.0, kinds=["slowdown"], methods=["PUT", "POST"])
    started = time.monotonic()
    with pytest.raises(StorageError) as failure:
        build(config, shard_ids={0})
    elapsed = time.monotonic() - started
    message = str(failure.value)
    assert message.startswith("uploading s3://faults/refused/megatron/train/shard-00000.bin failed: ")
    assert "SlowDown" in message and "Traceback" not in message
    assert elapsed < give_up_s()
    proxy.configure(rate=0)
    store = config.output.store()
    assert not store.exists(marker("tokenize", 0))
    assert not store.exists("megatron/train/shard-00000.bin")  # never half there
    build(config, shard_ids={0})  # the store is back: the rerun completes
    assert store.exists(marker("tokenize", 0)) and store.exists(marker("pack", 0))


def test_a_rerun_reads_each_committed_object_once_with_one_head(tmp_path, proxy, bucket):
    """A rerun's shards are reused once their files are found intact: each object's size by one HEAD, its sha256
    by one GET (it was three HEADs: exists, size, and the open's own); and their files, checked as they are when
    they were made, are not checked again (the check's download: a HEAD or two, a GET). Each marker is read with
    one GET (asking whether it exists first was a HEAD more, and opening it another)."""
    config = remote_config(tmp_path, proxy, "rerun")
    tokenizer = install_pretrained(config)

    def made(shard_id: int) -> tuple:
        tokenized, packed = build(config, shard_ids={shard_id})
        return (*tokenized, *packed), check_written(Checking.of(config, tokenizer), (*tokenized, *packed))

    assert made(0)[1] == []
    store = config.output.store()
    committed = {rel for stage in ("tokenize", "pack") for rel in store.read_json(marker(stage, 0))["files"]}
    proxy.seen.clear()
    results, problems = made(0)
    assert [r.reused for r in results] == [True, True] and problems == []
    asked = {rel: [m for m, path in proxy.seen if path.split("?")[0] == f"/faults/rerun/{rel}"] for rel in committed}
    assert len(committed) >= 6 and all(sorted(methods) == ["GET", "HEAD"] for methods in asked.values()), asked
    markers = {path for _, path in proxy.seen if "/_commits/" in path}  # read with a GET each, no HEAD
    read = {path: {m for m, p in proxy.seen if p == path} for path in markers}
    assert len(markers) >= 3 and all(methods == {"GET"} for methods in read.values()), read


def test_trusting_stamps_a_rerun_asks_each_kept_object_for_its_head_alone(tmp_path, proxy, bucket):
    """With `output.reuse_check: stamp`, a rerun reads each committed object once (a HEAD and a GET) and records
    its ETag in the marker; the next rerun asks each for its HEAD alone. An object overwritten since (other bytes of
    the same size) has another ETag: it is read, found changed, and its shard made again."""
    config = remote_config(tmp_path, proxy, "stamps")
    config.output.reuse_check = "stamp"
    store = config.output.store()
    build(config, shard_ids={0})
    build(config, shard_ids={0})  # reads every object, records their stamps
    markers = [store.read_json(marker(stage, 0)) for stage in ("tokenize", "pack")]
    assert all(set(m["stamps"]) == set(m["files"]) for m in markers) and len(markers[1]["files"]) >= 2
    committed = {rel for m in markers for rel in m["files"]}
    proxy.seen.clear()
    tokenized, packed = build(config, shard_ids={0})
    assert [r.reused for r in (*tokenized, *packed)] == [True, True]
    asked = {rel: [m for m, path in proxy.seen if path.split("?")[0] == f"/faults/stamps/{rel}"] for rel in committed}
    assert all(methods == ["HEAD"] for methods in asked.values()), asked

    rel = "megatron/train/shard-00000.bin"
    flipped = bytearray(store.read_bytes(rel))
    flipped[len(flipped) // 2] ^= 0x01
    store.write_bytes(rel, bytes(flipped))
    tokenized, _ = build(config, shard_ids={0})
    assert tokenized[0].redone == (
        f"tokenize shard 00000: {rel} changed content (sha256 differs) since its commit; redoing the shard"
    )
    assert store.read_bytes(rel) != bytes(flipped)


def test_the_reference_check_reads_the_documents_it_draws_from_an_object_store_and_not_their_shard(
    tmp_path, proxy, bucket, monkeypatch
):
    """validate's reference check reads the spans of the documents it draws from a shard's `.bin`, not the whole
    `.bin`: a nightly run draws its sample across every kept shard, and downloaded each one it drew from. Spans
    less than `RANGE_GAP` apart are one GET (here, with a gap of 1 MB allowed, the 0.6 MB shard's five documents);
    farther apart, as a large shard's are (here with no gap allowed), each is a GET of its own and nothing else of
    the `.bin` is read. The reference's ids the encoder's verification kept (none here) are asked for with one
    GET (asking whether the object exists was a HEAD and, for a missing one, a listing)."""
    config = remote_config(tmp_path, proxy, "reference")
    tokenizer = install_pretrained(config)
    tokenized, _ = build(config, shard_ids={0})
    shard = next(s for s in load_or_plan(config)[0].shards if s.shard_id == 0)
    documents = sum(counts["documents"] for counts in tokenized[0].splits.values())
    item = ReferenceItem(shard, sample=5, documents=documents, rejected=0, seed=1)
    run = Referencing.of(config, tokenizer)
    bin_rel = "megatron/train/shard-00000.bin"

    def check() -> tuple[list[str], int]:
        proxy.seen.clear()
        sent = proxy.sent
        found = check_reference(run, item)
        assert found["documents"] == 5 and not found["wrong"], found
        return [method for method, path in proxy.seen if path.endswith(bin_rel)], proxy.sent - sent

    check()  # the reference loaded
    kept_ids = [(m, path.split("?")[0]) for m, path in proxy.seen if "reference_ids" in path or "list-type" in path]
    assert kept_ids == [("GET", "/faults/reference/_work/reference_ids.parquet")], kept_ids
    monkeypatch.setattr(storage, "RANGE_GAP", 1 << 20)
    assert check()[0] == ["GET"]
    monkeypatch.setattr(storage, "RANGE_GAP", 0)
    asked, sent = check()
    assert 2 <= len(asked) <= 5 and set(asked) == {"GET"}, asked
    assert sent < config.output.store().size(bin_rel) / 10


def test_a_source_tree_on_an_object_store_is_read_with_one_get_a_file(tmp_path, proxy, bucket):
    """Text files of one document each (a source tree's) are read whole whatever their size: one GET a file, not
    an open's HEAD and then its GET, so a tree of small files costs half the requests. Their documents are the
    files, read as on disk (tests/test_s3.py)."""
    from tokenmill.io.readers import read_documents
    from tokenmill.stages.partition import plan_shards

    files = {f"tree/d{i % 3}/f{i}.c": f"int f{i};\n" * (i + 1) for i in range(30)}
    s3 = boto3.client("s3")
    for key, text in files.items():
        s3.put_object(Bucket=bucket, Key=key, Body=text.encode())
    config = input_config(tmp_path, proxy, f"s3://{bucket}/tree/**", 2000, format="text")
    plan, options = plan_shards(config), config.input.read_options()
    assert len(plan.shards) > 2
    proxy.seen.clear()
    documents = {}
    for shard in plan.shards:
        for batch, bad in read_documents(shard.pieces, options, columnar=True):
            documents |= dict(zip(batch.ids, map(str, batch.text_values()), strict=True))
            assert not bad
    assert documents == {key.removeprefix("tree/"): text for key, text in files.items()}
    asked = sorted((method, path.split("?")[0]) for method, path in proxy.seen)
    assert asked == sorted(("GET", f"/{bucket}/{key}") for key in files), asked


def test_a_crawls_small_jsonl_parts_on_an_object_store_are_read_with_one_get_a_part(tmp_path, proxy, bucket):
    """Small JSON Lines parts, joined a run at a time (tests/test_s3.py): each read with one GET, its size known from
    the plan's listing (`Piece.size`), where opening it asked its size first (a HEAD); the sample stage takes their
    sizes from the plan too. A part larger than a batch is not downloaded into a run: the reader reads it alone."""
    from tokenmill.io.readers import read_documents, whole_file_sizes
    from tokenmill.stages.partition import plan_shards

    parts = {
        f"cc/part-{i:03d}.jsonl": "".join(f'{{"text": "part {i} page {r}"}}\n' for r in range(8)) for i in range(24)
    }
    parts["cc/part-011.jsonl"] = '{"text": "a long page ' + "word " * 1000 + '"}\n'  # 5 KB: more than a batch
    s3 = boto3.client("s3")
    for key, body in parts.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body.encode())
    config = input_config(tmp_path, proxy, f"s3://{bucket}/cc/", 20_000)
    shards, options = plan_shards(config).shards, config.input.read_options()
    pieces = [piece for shard in shards for piece in shard.pieces]
    proxy.seen.clear()
    assert whole_file_sizes(pieces, options) == {f"s3://{bucket}/{k}": len(v) for k, v in parts.items()}
    read = (read_documents(shard.pieces, options, True, 3_000) for shard in shards)
    texts = [str(t) for batches in read for b, _ in batches for t in b.text_values()]
    assert len(texts) == 23 * 8 + 1 and "part 0 page 0" in texts
    asked = sorted((method, path.split("?")[0]) for method, path in proxy.seen)
    alone = f"/{bucket}/cc/part-011.jsonl"  # opened: a HEAD, then its GET
    together = sorted(("GET", f"/{bucket}/{key}") for key in parts if f"/{bucket}/{key}" != alone)
    assert [(method, path) for method, path in asked if path != alone] == together, asked
    assert [method for method, path in asked if path == alone] == ["GET", "HEAD"], asked
    # a part grown past a batch since it was listed: the run's GET stops a byte past the batch, and it is read alone
    s3.put_object(Bucket=bucket, Key="cc/part-005.jsonl", Body=parts["cc/part-011.jsonl"].replace("a long", "grown"))
    read = (read_documents(shard.pieces, options, True, 3_000) for shard in shards)
    grown = [str(t) for batches in read for b, _ in batches for t in b.text_values() if str(t).startswith("grown")]
    assert len(grown) == 1 and len(grown[0]) > 5000


def test_the_held_out_documents_of_a_shard_are_read_with_one_get(tmp_path, proxy, bucket):
    """The fertility report reads each shard's held-out documents whole (a shard's part of a few MB): one GET
    each, not an open's HEAD and its GET."""
    from tokenmill.core.layout import holdout_file
    from tokenmill.core.samples import holdout_records

    config = remote_config(tmp_path, proxy, "holdout")
    records = [{"text": f"held out {i}\r\n", "lang": "en"} for i in range(3)]
    config.output.store().write_bytes(holdout_file(7), b"".join(orjson.dumps(r) + b"\n" for r in records))
    proxy.seen.clear()
    assert list(holdout_records(config, [7])) == records
    assert [method for method, _ in proxy.seen] == ["GET"], proxy.seen


def test_publish_copies_an_object_within_the_store_with_one_request(tmp_path, proxy, bucket):
    """Publishing to the store the build is in copies each file server-side, its size known from the manifest: the
    copy's PUT alone. s3fs's `cp_file` asked the source's size first (a HEAD), and fsspec's `copy` also listed both
    paths as prefixes, two requests more. Without a size, the HEAD and the PUT."""
    source, target = (remote_config(tmp_path, proxy, prefix).output.store() for prefix in ("build", "published/v1"))
    source.write_bytes("megatron/train/shard-00000.bin", b"tokens" * 1000)
    for size, requests in ((6000, ["PUT"]), (None, ["HEAD", "PUT"])):
        target.remove("megatron/train/shard-00000.bin")
        proxy.seen.clear()
        _copy(source, target, "megatron/train/shard-00000.bin", size)
        assert [method for method, _ in proxy.seen] == requests, proxy.seen
        assert target.read_bytes("megatron/train/shard-00000.bin") == b"tokens" * 1000


def test_a_layout_that_is_the_bin_is_copied_inside_the_object_store_with_one_request(tmp_path, proxy, bucket):
    """OLMo's `.npy` and datatrove's `.ds` are the `.bin`'s bytes (`Store.copy`): on an object store a server-side
    copy, its size known from the tokenize marker, so one request (fsspec's `copy` was four: two listings, a HEAD,
    the copy); the pack marker records the `.bin`'s digest for it."""
    store = remote_config(tmp_path, proxy, "layouts").output.store()
    data = b"tokens" * 1000
    store.write_bytes("megatron/train/shard-00000.bin", data)
    digest, record = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, {}
    proxy.seen.clear()
    store.copy("megatron/train/shard-00000.bin", "olmo/train/shard-00000.npy", digest, record)
    assert [method for method, _ in proxy.seen] == ["PUT"], proxy.seen
    assert store.read_bytes("olmo/train/shard-00000.npy") == data
    assert record == {"olmo/train/shard-00000.npy": digest}


def test_shards_moved_to_new_ids_on_an_object_store_are_a_copy_and_a_delete_a_file(tmp_path, proxy, bucket):
    """A file landed before others in input order moves the shards after it up an id, their files renamed
    (`commits.land`, `Store.move_all`): on an object store each is a server-side copy, its size known from its
    marker, then a delete; fsspec's `mv` also listed both paths and asked the size. A cycle goes round through a
    temporary name, the same way."""
    store = remote_config(tmp_path, proxy, "moving").output.store()
    files = {f"megatron/train/shard-{i:05d}.bin": f"shard {i}".encode() * 100 for i in range(3)}
    for rel, data in files.items():
        store.write_bytes(rel, data)
    sizes = {rel: len(data) for rel, data in files.items()}
    rels = list(files)
    proxy.seen.clear()
    store.move_all({rels[1]: rels[2], rels[2]: "megatron/train/shard-00003.bin"}, sizes)
    assert sorted(method for method, _ in proxy.seen) == ["DELETE", "DELETE", "PUT", "PUT"], proxy.seen
    proxy.seen.clear()
    store.move_all({rels[0]: rels[2], rels[2]: rels[0]}, {rels[0]: sizes[rels[0]], rels[2]: sizes[rels[1]]})  # a cycle
    assert sorted(method for method, _ in proxy.seen) == ["DELETE"] * 3 + ["PUT"] * 3, proxy.seen
    assert store.read_bytes(rels[0]) == files[rels[1]] and store.read_bytes(rels[2]) == files[rels[0]]
    assert store.read_bytes("megatron/train/shard-00003.bin") == files[rels[2]] and not store.exists(rels[1])


def test_publishing_a_version_to_an_object_store_asks_for_no_missing_file(tmp_path, proxy, bucket):
    """A version published to an object store is listed once: a file not there is copied (one request), without a
    HEAD and a listing of its own; a file there is read for its sha256 and not copied."""
    config = remote_config(tmp_path, proxy, "publishing")
    config.output.publish.path = f"s3://{bucket}/versions"
    config.output.publish.storage.endpoint_url = proxy.endpoint
    source = config.output.store()
    files = Files()
    for rel, data in {
        "megatron/train/shard-00000.bin": b"a" * 100,
        "megatron/train/shard-00000.idx": b"b" * 50,
    }.items():
        source.write_bytes(rel, data)
        files.add("megatron", rel, {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    source.write_bytes("manifest.json", b"{}")
    proxy.seen.clear()
    with files:
        first = publish_version(config, {"version": "v1"}, files)
        asked = [(m, path.split("?")[0]) for m, path in proxy.seen if "shard-00000" in path]
        proxy.seen.clear()
        again = publish_version(config, {"version": "v1"}, files)
    assert (first["copied"], again["copied"], again["skipped"]) == (2, 0, 2)
    published = "/faults/versions/faults/v1/megatron/train/shard-00000"
    assert sorted(asked) == [("PUT", f"{published}.{ext}") for ext in ("bin", "idx")], asked
    assert not [m for m, path in proxy.seen if "shard-00000" in path and m == "PUT"], proxy.seen
