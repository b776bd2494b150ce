"""rerun_shards: redo chosen shards of an earlier run (or every shard that did not commit), then validate and
publish again. The earlier run's config is read back from its output, but for its cluster, endpoints and
credentials, which are the rerun's own: whoever can write the output location must not choose where the shards'
code runs, nor where the credentials go (tokenmill.commands.runs.NOT_STORED). Given a config, the rerun takes nothing
from the output location: it checks that the config defines the dataset stored there, and runs it."""

# No `from __future__ import annotations`: `tokenmill serve` hands its runs this flow pickled by value, whose
# parameters are validated against their annotations, which must then be the classes, not their names
from prefect import flow, get_run_logger

from flows.main import corpus_to_tokens
from tokenmill.commands.runs import forget_shards, load_run_config, taken_from
from tokenmill.config import DaskConfig, TokenmillConfig


@flow(name="rerun-shards")
def rerun_shards(output: str, shard_ids: list[int] | None = None, config: TokenmillConfig | None = None) -> dict:
    """Redo exactly `shard_ids` of the dataset at `output` (none given: only the shards without a commit), with
    `config` (none: the one stored in the output, on a LocalCluster or $TOKENMILL_DASK_ADDRESS, with the
    environment's S3 endpoint and credentials)."""
    run_config, stored = load_run_config(output, config)
    get_run_logger().info("%s; the cluster: %s", taken_from(output, stored), cluster_of(run_config.dask))
    if shard_ids:
        forgotten = forget_shards(run_config, shard_ids)
        get_run_logger().info("redoing shards %s (%d commit markers removed)", shard_ids, forgotten)
    return corpus_to_tokens(run_config, rebuild=bool(shard_ids))  # named shards are redone though published


def cluster_of(dask: DaskConfig) -> str:
    """A cluster config in a few words, for the rerun's log."""
    return dask.scheduler() or ("SLURM jobs" if dask.slurm else "a LocalCluster")
