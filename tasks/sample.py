"""sample[shards]: each shard's proportional part of the tokenizer training sample and of the held-out sample."""

from prefect import task

from tasks.shards import GROUP_TASK, Stage, run_on_dask
from tokenmill.config import TokenmillConfig
from tokenmill.core.plan import Shard
from tokenmill.core.samples import Sampled


@task(name="sample", **GROUP_TASK)
def sample_shards(
    config: TokenmillConfig, items: list[Shard], train_fraction: float, holdout_fraction: float
) -> list[Sampled]:
    """Each shard's sample files and sizes (training the tokenizer reads them all)."""
    stage = Stage.of("sample", config, train_fraction, holdout_fraction)
    return [r[0] for r in run_on_dask(items, [stage])]


@task(name="sample", **GROUP_TASK)
def holdout_shards(config: TokenmillConfig, items: list[Shard], train_fraction: float, holdout_fraction: float) -> int:
    """As `sample_shards`, for the tokenizer report alone (no tokenizer to train): the shards' held-out files are
    named by their shard ids (`tokenmill.core.samples.holdout_records`), so the group keeps nothing of their
    results (about 0.75 KB a shard, held until the group ended); the number of shards sampled."""
    stage = Stage.of("sample", config, train_fraction, holdout_fraction)
    return len(run_on_dask(items, [stage], keep=lambda _: None))
