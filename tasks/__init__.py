"""Prefect tasks, one module per DAG stage, each a thin wrapper over a `tokenmill` library call.

Shard stages (shards.py) are task runs over groups of shards, each shard a Dask task of the library's shard
function; they pass small descriptors (config, shard dict, TokenizerInfo, counts) and never token arrays, and
are idempotent through the library's commit markers, so retries and reruns redo nothing.
"""
