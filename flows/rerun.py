"""rerun_shards: redo chosen shards of an earlier run (or every shard that did not commit), then
validate and publish again. The earlier run's config is read back from its output."""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.main import corpus_to_tokens
from tokenmill.runs import forget_shards, load_run_config


@flow(name="rerun-shards")
def rerun_shards(output: str, shard_ids: list[int] | None = None) -> dict:
    """Redo exactly `shard_ids` of the dataset at `output` (none given: only the shards without a commit)."""
    config = load_run_config(output)
    if shard_ids:
        forgotten = forget_shards(config, shard_ids)
        get_run_logger().info("redoing shards %s (%d commit markers removed)", shard_ids, forgotten)
    return corpus_to_tokens(config, rebuild=bool(shard_ids))  # named shards are redone though published
