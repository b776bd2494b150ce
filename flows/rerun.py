"""rerun_shards: redo chosen shards of an earlier run (or every shard that did not commit), then
validate and publish again. The earlier run's config is read back from its output, but for its cluster, which is
the rerun's own: whoever can write the output location must not choose where the shards' code runs."""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.main import corpus_to_tokens
from tokenmill.config import DaskConfig
from tokenmill.runs import RUN_CONFIG, forget_shards, load_run_config


@flow(name="rerun-shards")
def rerun_shards(output: str, shard_ids: list[int] | None = None, dask: DaskConfig | None = None) -> dict:
    """Redo exactly `shard_ids` of the dataset at `output` (none given: only the shards without a commit), on the
    cluster `dask` says (none: a LocalCluster, or $TOKENMILL_DASK_ADDRESS), never the one stored in the output."""
    config, stored = load_run_config(output, dask)
    taken, where = ", ".join(stored), cluster_of(config.dask)
    get_run_logger().info("from %s/%s: %s; the cluster from this rerun: %s", output, RUN_CONFIG, taken, where)
    if shard_ids:
        forgotten = forget_shards(config, shard_ids)
        get_run_logger().info("redoing shards %s (%d commit markers removed)", shard_ids, forgotten)
    return corpus_to_tokens(config, rebuild=bool(shard_ids))  # named shards are redone though published


def cluster_of(dask: DaskConfig) -> str:
    """A cluster config in a few words, for the rerun's log."""
    return dask.scheduler() or ("SLURM jobs" if dask.slurm else "a LocalCluster")
