"""Shard commit markers: the source of truth for what is done.

A stage writes its shard's files first and its marker last; the marker holds the stage key (a hash of
everything the output depends on), the shard's stats, and the size and sha256 of every file the shard wrote
(hashed locally right after writing, while the bytes are in the page cache). A task that finds a marker with
its key, and every file still as recorded, returns those stats at once, so reruns, retries and Dask's
recomputations redo nothing; a file changed or deleted since its commit (a bit flip, a truncation, a stray
`rm`) makes the shard be redone, and the result says why (`redone`).
"""

from __future__ import annotations

from tokenmill.storage import Store

STAGES = ("scatter", "gather", "sample", "tokenize", "pack")  # the stages that commit per shard


def marker(stage: str, shard_id: int) -> str:
    return f"_commits/{stage}/shard-{shard_id:05d}.json"


class Commit:
    """What a shard task learns from its marker: the committed result, or why there is none to reuse."""

    def __init__(self, result: dict | None = None, redone: str | None = None):
        self.result, self.redone = result, redone


def check(store: Store, stage: str, shard_id: int, key: str) -> Commit:
    """The committed result of `stage` for this shard if it was made with `key` and its files are intact;
    else `redone` says what changed (None when there was no usable marker at all)."""
    rel = marker(stage, shard_id)
    if not store.exists(rel):
        return Commit()
    done = store.read_json(rel)
    if done.get("key") != key:
        return Commit()
    for path, recorded in sorted(done.get("files", {}).items()):
        if (damage := changed(store, path, recorded)) is not None:
            return Commit(redone=f"{stage} shard {shard_id:05d}: {path} {damage} since its commit; redoing the shard")
    return Commit(done["result"])


def changed(store: Store, path: str, recorded: dict) -> str | None:
    """How a committed file differs from its record: missing, another size, other bytes; None if intact.
    The size is compared first (a metadata call); the sha256 then reads the file (~1 GB/s locally)."""
    if not store.exists(path):
        return "was deleted"
    if (size := store.size(path)) != recorded["bytes"]:
        return f"changed size ({size} bytes, {recorded['bytes']} committed)"
    if store.sha256(path) != recorded["sha256"]:
        return "changed content (sha256 differs)"
    return None


def committed(store: Store, stage: str, shard_id: int, key: str) -> dict | None:
    """The committed result of `stage` for this shard, if it was made with `key` and its files are intact."""
    return check(store, stage, shard_id, key).result


def commit(store: Store, stage: str, shard_id: int, key: str, result: dict, files: dict | None = None) -> dict:
    """Write the marker, last: `files` maps each file the shard wrote to its size and sha256 (see
    `Store.writing(rel, record=files)`)."""
    store.write_json(marker(stage, shard_id), {"key": key, "result": result, "files": files or {}})
    return result


def discard(store: Store, shard_ids: list[int]) -> None:
    """Remove what the shards committed in every stage, files first, markers last: their ids now name other
    shards (or none), and a reader of the build directory must not find an old shard's file beside them."""
    for stage in STAGES:
        for shard_id in shard_ids:
            rel = marker(stage, shard_id)
            if store.exists(rel):
                for path in store.read_json(rel).get("files", {}):
                    store.remove(path)
                store.remove(rel)
