"""sample[shard]: each shard's proportional part of the tokenizer training sample and of the held-out sample."""

from prefect import task

from tokenmill import sampling
from tokenmill.config import TokenmillConfig


@task(name="sample", task_run_name="sample[shard-{shard[shard_id]:05d}]", retries=2)
def sample_shard(config: TokenmillConfig, shard: dict, train_fraction: float, holdout_fraction: float) -> dict:
    return sampling.sample_shard(config, shard, train_fraction, holdout_fraction)
