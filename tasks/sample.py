"""sample[shards]: each shard's proportional part of the tokenizer training sample and of the held-out sample."""

from prefect import task

from tasks.shards import GROUP_TASK, Stage, run_on_dask
from tokenmill import sampling
from tokenmill.config import TokenmillConfig


@task(name="sample", **GROUP_TASK)
def sample_shards(config: TokenmillConfig, items: list[dict], train_fraction: float, holdout_fraction: float) -> list:
    stage = Stage("sample", sampling.sample_shard, (train_fraction, holdout_fraction))
    return [r[0] for r in run_on_dask(config, items, [stage])]
