"""Scheduled runs over a growing input, as a nightly deployment makes them: a file lands, one is replaced, one is
removed, nothing changes. Each run publishes the input as it is now as a new version, reuses the committed
shards of unchanged files (their task bodies never run: their commit markers are not rewritten), and leaves
the earlier versions intact; an unchanged input publishes nothing. On local paths and on the S3-protocol test
server (moto, on 127.0.0.1)."""

from __future__ import annotations

import gzip
import shutil

import boto3
import pytest

from tokenmill.core.layout import marker
from tokenmill.io.storage import Store

from .conftest import CORPORA

DOCS = 1_000  # per input file: about 1.6 MB of enwiki text, one shard each with partition.shard_size=1MB


@pytest.fixture(scope="module")
def enwiki_docs() -> list[bytes]:
    lines = []
    with gzip.open(CORPORA / "enwiki_slice" / "enwiki_slice.jsonl.gz", "rb") as f:
        for line in f:
            lines.append(line)
            if len(lines) == 4 * DOCS:
                return lines
    raise AssertionError("enwiki_slice holds fewer documents than the test needs")


class Place:
    """Where the input lands, the build runs and versions are published: a local directory or S3 buckets."""

    def __init__(self, kind: str, tmp_path):
        self.kind = kind
        if kind == "local":
            self.input, self.build, self.root = (str(tmp_path / d) for d in ("in", "build", "published"))
        else:
            s3 = boto3.client("s3")
            for bucket in ("incoming", "builds", "datasets"):
                s3.create_bucket(Bucket=bucket)
            self.input, self.build, self.root = "s3://incoming/in", "s3://builds/nightly", "s3://datasets"

    def land(self, name: str, lines: list[bytes]) -> None:
        Store(self.input).write_bytes(name, gzip.compress(b"".join(lines), mtime=0))

    def remove(self, name: str) -> None:
        Store(self.input).remove(name)

    def args(self, *extra: str) -> list[str]:
        return [
            "run", "examples/gpt2.yaml", "--set", "name=nightly", "--set", f"input.paths=[{self.input}/*.jsonl.gz]",
            "--set", "partition.shard_size=1MB", "--set", f"output.path={self.build}",
            "--set", f"output.publish.path={self.root}", *extra,
        ]  # fmt: skip


def stamps(store: Store, prefix: str = "") -> dict[str, tuple]:
    """Every file under `prefix` with its size and modification stamp (mtime, or S3's LastModified)."""
    base = store.path(prefix).rstrip("/")
    found = store.fs.find(base, detail=True) if store.fs.exists(base) else {}
    return {p[len(store.root) + 1 :]: (i["size"], i.get("mtime") or i.get("LastModified")) for p, i in found.items()}


def shard_of(build: Store, name: str) -> int:
    """The shard the build's plan made from input file `name` (one file per shard here)."""
    (shard,) = [s["shard_id"] for s in build.read_json("plan.json")["shards"] if s["pieces"][0]["path"].endswith(name)]
    return shard


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_nightly_runs_over_a_growing_input(run_cli, s3_server, enwiki_docs, tmp_path, kind):
    place = Place(kind, tmp_path)
    build, root = Store(place.build), Store(f"{place.root}/nightly")
    part = {i: enwiki_docs[(i - 1) * DOCS : i * DOCS] for i in (1, 2, 3)}

    def run(*extra: str) -> dict:
        out = run_cli(*place.args(*extra))
        manifest = root.read_json(f"{root.read_bytes('LATEST').decode().strip()}/manifest.json")
        return {**manifest, "_stdout": out.stdout}

    def markers() -> dict[str, tuple]:
        return stamps(build, "_commits/tokenize")

    # night 1: two files
    place.land("part-1.jsonl.gz", part[1])
    place.land("part-2.jsonl.gz", part[2])
    v1 = run()
    assert v1["counts"]["documents_in"] == 2 * DOCS
    assert v1["lineage"] == {"previous_version": None, "shards_kept": 0, "shards_made": 2}

    # night 2: a third file landed. A new version with all three; the first two files' shards are not redone.
    before = markers()
    place.land("part-3.jsonl.gz", part[3])
    v2 = run()
    assert v2["version"] != v1["version"]
    assert v2["counts"]["documents_in"] == 3 * DOCS
    assert [f["path"].rsplit("/", 1)[-1] for f in v2["inputs"]["files"]] == [f"part-{i}.jsonl.gz" for i in (1, 2, 3)]
    assert all(("etag" if kind == "s3" else "mtime") in f and f["size"] > 0 for f in v2["inputs"]["files"])
    assert v2["lineage"] == {
        "previous_version": v1["version"], "inputs_added": 1, "inputs_changed": 0, "inputs_removed": 0,
        "shards_kept": 2, "shards_made": 1,
    }  # fmt: skip
    kept = [
        marker("tokenize", shard_of(build, f"part-{i}.jsonl.gz")).removeprefix("_commits/tokenize/") for i in (1, 2)
    ]
    now = markers()
    assert len(now) == 3 and all(now[f"_commits/tokenize/{k}"] == before[f"_commits/tokenize/{k}"] for k in kept)

    # night 3: nothing changed. Nothing is built or published: no file of the versions or the build changes.
    published_before, build_before = stamps(root), stamps(build)
    again = run_cli(*place.args())
    assert "Nothing to do" in again.stdout and v2["version"] in again.stdout
    assert stamps(root) == published_before and stamps(build) == build_before

    # night 4: part-2 replaced with other documents (900 of them). Only its shard is redone.
    before = markers()
    place.land("part-2.jsonl.gz", enwiki_docs[3 * DOCS : 3 * DOCS + 900])
    v3 = run()
    assert v3["counts"]["documents_in"] == 2 * DOCS + 900
    assert v3["lineage"] == {
        "previous_version": v2["version"], "inputs_added": 0, "inputs_changed": 1, "inputs_removed": 0,
        "shards_kept": 2, "shards_made": 1,
    }  # fmt: skip
    redone = marker("tokenize", shard_of(build, "part-2.jsonl.gz"))
    now = markers()
    assert now[redone] != before[redone]
    assert {k: v for k, v in now.items() if k != redone} == {k: v for k, v in before.items() if k != redone}

    # night 5: part-3 removed, and only the newest two versions kept
    place.remove("part-3.jsonl.gz")
    v4 = run("--set", "output.publish.keep_versions=2")
    assert v4["counts"]["documents_in"] == DOCS + 900
    assert v4["lineage"]["inputs_removed"] == 1 and v4["lineage"]["shards_made"] == 0
    assert f"deleted old versions (keep_versions): {v2['version']}, {v1['version']}" in v4["_stdout"]
    assert not root.exists(f"{v1['version']}/manifest.json") and not root.exists(f"{v2['version']}/manifest.json")
    assert stamps(root, v1["version"]) == {} and stamps(root, v2["version"]) == {}

    # the version before is intact and verifies, and diff names what changed between the two
    verified = run_cli("inspect", f"{root.url}/{v3['version']}", "--verify")
    assert f"verified: all {len(v3['files'])} files match the manifest" in verified.stdout
    assert f"built from version {v2['version']}: 0 input files added, 1 changed, 0 removed; 2 shards kept, 1 made" in (
        verified.stdout
    )
    diff = run_cli("diff", f"{root.url}/{v3['version']}", root.url).stdout
    assert "0 input files added" in diff and "1 input files removed" in diff and "part-3.jsonl.gz" in diff
    assert f"documents_in: {2 * DOCS + 900:,} -> {DOCS + 900:,} (-{DOCS:,})" in diff
    assert "verified" in run_cli("inspect", root.url, "--verify").stdout

    # night 6: a file lands that sorts before the others. The shards after it move up an id, with their committed
    # output (their results are the ones committed before, not made again), and the version is the one a first
    # run over the same files makes in an empty build: the same name, the same bytes.
    tokenized_before = {i: build.read_json(marker("tokenize", shard_of(build, f"part-{i}.jsonl.gz"))) for i in (1, 2)}
    place.land("part-0.jsonl.gz", part[3])
    v5 = run()
    assert v5["lineage"]["shards_kept"] == 2 and v5["lineage"]["shards_made"] == 1
    for i in (1, 2):
        moved = build.read_json(marker("tokenize", shard_of(build, f"part-{i}.jsonl.gz")))
        assert moved["result"]["shard_id"] == tokenized_before[i]["result"]["shard_id"] + 1
        assert moved["result"] | {"shard_id": 0} == tokenized_before[i]["result"] | {"shard_id": 0}
    fresh = run_cli(
        *place.args("--set", f"output.path={place.build}-fresh", "--set", f"output.publish.path={place.root}/fresh")
    )
    fresh_root = Store(f"{place.root}/fresh/nightly")
    assert fresh_root.read_bytes("LATEST").decode().strip() == v5["version"], fresh.stdout
    assert fresh_root.read_json(f"{v5['version']}/manifest.json")["files"] == v5["files"]

    if kind == "local":
        shutil.rmtree(tmp_path / "build")  # the published versions do not depend on the build directory
        assert "verified" in run_cli("inspect", f"{root.url}/{v3['version']}", "--verify").stdout


def test_a_named_version_published_from_another_input_is_not_overwritten(tmp_path, gpt2_info):
    from tokenmill.config import TokenmillConfig
    from tokenmill.core.plan import Plan, Shards
    from tokenmill.stages.publish import FILES_LISTED, VersionConflict, already_published, version_store

    (tmp_path / "a.jsonl").write_text('{"id": "1", "text": "one"}\n')
    config = TokenmillConfig.model_validate(
        {
            "name": "named",
            "input": {"paths": [str(tmp_path / "*.jsonl")]},
            "tokenizer": {"path": "unused.json", "eod": "<|endoftext|>"},
            "output": {"path": str(tmp_path / "build"), "publish": {"version": "2026-11"}},
        }
    )
    tokenizer = gpt2_info(config)
    plan = Plan("key", "config-key", "the-input-now", 1000, None, [], Shards())
    assert already_published(config, plan, tokenizer) is None
    manifest = {
        "dataset_hash": config.dataset_hash(),
        "inputs": {"hash": "another-input"},
        "tokenizer": {"sha256": tokenizer.sha256},
    }
    version_store(config, "2026-11").write_json("manifest.json", manifest)
    with pytest.raises(VersionConflict, match="2026-11 was published from another input"):
        already_published(config, plan, tokenizer)
    manifest["inputs"]["hash"] = "the-input-now"
    version_store(config, "2026-11").write_json("manifest.json", manifest)
    assert already_published(config, plan, tokenizer) == {**manifest, FILES_LISTED: 0}


def test_an_upgrade_of_tokenmill_reuses_no_shard_but_keeps_the_published_version(tmp_path, monkeypatch):
    """docs/guarantees.md: a shard's tokenize key includes tokenmill's version (a marker of another release cannot
    vouch for this one's bytes), a dataset's version name does not (a version already published stays as it is)."""
    from tokenmill.config import TokenmillConfig
    from tokenmill.core import commits
    from tokenmill.core.plan import Plan, Shards
    from tokenmill.stages import publish
    from tokenmill.stages.train_tokenizer import install_pretrained

    from .conftest import EXAMPLES

    config = TokenmillConfig.model_validate(
        {
            "name": "upgraded",
            "input": {"paths": [str(tmp_path / "*.jsonl")]},
            "tokenizer": {"path": str(EXAMPLES / "tokenizers" / "gpt2" / "tokenizer.json")},
            "output": {"path": str(tmp_path / "build")},
        }
    )
    tokenizer = install_pretrained(config)
    plan = Plan("key", "config-key", "the-input-now", 1000, None, [], Shards())
    before = commits.tokenize_key(config, tokenizer), publish.dataset_version(config, plan, tokenizer)
    monkeypatch.setattr(commits, "__version__", "99.0.0")
    monkeypatch.setattr(publish, "__version__", "99.0.0")
    after = commits.tokenize_key(config, tokenizer), publish.dataset_version(config, plan, tokenizer)
    assert after[0] != before[0] and after[0].endswith("-99.0.0")
    assert after[1] == before[1]
