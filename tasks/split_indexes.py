"""split_indexes: after every pack[shard], each split's indexes over all its shards: its packed rows' global
shuffle, litdata's and MDS's `index.json`, and a single input's Megatron data-args files (a mixture's come with its
mix: tasks/mix.py)."""

import pandas as pd
from prefect import task

from tasks import UNCACHED
from tokenmill import mix, pack
from tokenmill.config import TokenmillConfig
from tokenmill.plan import Plan
from tokenmill.publish import dataset_version, version_store
from tokenmill.tokenizer_info import TokenizerInfo


@task(name="split_indexes", retries=2, **UNCACHED)
def split_indexes(config: TokenmillConfig, plan: Plan, tokenizer: TokenizerInfo, table: pd.DataFrame) -> dict[str, int]:
    rows = pack.write_split_indexes(config, tokenizer, table)
    if not config.mixture:
        published = version_store(config, dataset_version(config, plan, tokenizer)).url
        mix.write_megatron_args(config, table, published)
    return rows
