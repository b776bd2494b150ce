"""validate: counts reconcile and files are sound, or the run fails with a readable report. Each shard's files
were checked on the cluster as the last step of its tokenize chain (`check`, while they were fresh: `problems` is
what it found); the documents of the reference's sample are checked on the cluster too, a shard at a time
(`reference[shard]`); the rest here."""

import pandas as pd
from prefect import task

from tasks import UNCACHED
from tasks.shards import Stage, on_a_worker, run_on_dask
from tokenmill.config import TokenmillConfig
from tokenmill.core.plan import Plan
from tokenmill.stages import validate as library
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo


@task(name="validate", **UNCACHED)
def validate(
    config: TokenmillConfig, plan: Plan, tokenizer: TokenizerInfo, table: pd.DataFrame, problems: list[str],
    checker: str | None,
) -> pd.DataFrame:  # fmt: skip
    """`checker`: the worker that has loaded pandera for the stats table's check (`flows.cluster.checking_worker`)."""

    def on_the_cluster(name: str, items: list, work, context, *args) -> list:
        return [result for (result,) in run_on_dask(items, [Stage(name, work, context, args)])]

    def on_the_checker(work, *args):
        return on_a_worker(work, *args, priority=1, preferred=checker)

    return library.validate(config, plan, tokenizer, table, on_the_cluster, checked=problems, away=on_the_checker)
