"""scatter[input shards] and gather[output shards]: the optional global document shuffle."""

from prefect import task

from tasks.shards import GROUP_TASK, Stage, run_on_dask
from tokenmill.config import TokenmillConfig
from tokenmill.core.plan import Shard
from tokenmill.stages.shuffle_documents import Moved


@task(name="scatter", **GROUP_TASK)
def scatter_shards(config: TokenmillConfig, items: list[Shard], n_outputs: int) -> list[Moved]:
    stage = Stage.of("scatter", config, args=(n_outputs,))
    return [r[0] for r in run_on_dask(items, [stage])]


@task(name="gather", **GROUP_TASK)
def gather_shards(config: TokenmillConfig, items: list[int], sources: list[int], plan_key: str) -> list[Moved]:
    stage = Stage.of("gather", config, args=(sources, plan_key))
    return [r[0] for r in run_on_dask(items, [stage])]
