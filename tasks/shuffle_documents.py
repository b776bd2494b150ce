"""scatter[input shard] and gather[output shard]: the optional global document shuffle."""

from prefect import task

from tokenmill import shuffle_documents
from tokenmill.config import TokenmillConfig


@task(name="scatter", task_run_name="scatter[shard-{shard[shard_id]:05d}]", retries=2)
def scatter_shard(config: TokenmillConfig, shard: dict, n_outputs: int) -> dict:
    return shuffle_documents.scatter_shard(config, shard, n_outputs)


@task(name="gather", task_run_name="gather[shard-{target:05d}]", retries=2)
def gather_shard(config: TokenmillConfig, target: int, n_sources: int) -> dict:
    return shuffle_documents.gather_shard(config, target, n_sources)
