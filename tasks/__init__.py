"""Prefect tasks, one module per DAG stage, each a thin wrapper over a `tokenmill` library call.

Shard tasks pass small descriptors (config, shard dict, TokenizerInfo, counts) and never token arrays;
they are idempotent through the library's commit markers, so retries and reruns redo nothing.
"""
