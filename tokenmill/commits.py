"""Shard commit markers: the source of truth for what is done.

A stage writes its shard's files first and its marker last; the marker holds the stage key (a hash of
everything the output depends on) and the shard's stats. A task that finds a marker with its key
returns those stats at once, so reruns, retries and Dask's recomputations redo nothing.
"""

from __future__ import annotations

from tokenmill.storage import Store


def marker(stage: str, shard_id: int) -> str:
    return f"_commits/{stage}/shard-{shard_id:05d}.json"


def committed(store: Store, stage: str, shard_id: int, key: str) -> dict | None:
    """The committed result of `stage` for this shard, if it was made with `key`."""
    rel = marker(stage, shard_id)
    if not store.exists(rel):
        return None
    done = store.read_json(rel)
    return done["result"] if done.get("key") == key else None


def commit(store: Store, stage: str, shard_id: int, key: str, result: dict) -> dict:
    store.write_json(marker(stage, shard_id), {"key": key, "result": result})
    return result
