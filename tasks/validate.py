"""validate: counts reconcile and files are sound, or the run fails with a readable report. Each shard's files
are checked on the cluster (`check[shard]`), the rest here."""

import pandas as pd
from prefect import task

from tasks import UNCACHED
from tasks.shards import Stage, run_on_dask
from tokenmill import validate as library
from tokenmill.config import TokenmillConfig
from tokenmill.tokenizer import TokenizerInfo


@task(name="validate", **UNCACHED)
def validate(config: TokenmillConfig, plan: dict, tokenizer: TokenizerInfo, table: pd.DataFrame) -> pd.DataFrame:
    def on_the_cluster(shards: list[dict]) -> list[str]:
        checks = run_on_dask(config, shards, [Stage("check", library.check_shard, (tokenizer,))])
        return [p for (problems,) in checks for p in problems]

    return library.validate(config, plan, tokenizer, table, on_the_cluster)
