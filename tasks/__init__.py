"""Prefect tasks, one module per DAG stage, each a thin wrapper over a `tokenmill` library call.

Shard stages (shards.py) are task runs over groups of shards, each shard a Dask task of the library's shard
function; they pass small descriptors (config, a `Shard`, TokenizerInfo, results and counts) and never token arrays, and
are idempotent through the library's commit markers, so retries and reruns redo nothing.
"""

from prefect.cache_policies import NO_CACHE

# Every task's options: reuse is the commit markers' business, so Prefect neither persists a task's result nor
# hashes its inputs for a cache key (its default policy did so for every task, on every call: 8 s for a
# 100,000-shard plan, which several tasks are given).
UNCACHED = {"cache_policy": NO_CACHE, "persist_result": False}
