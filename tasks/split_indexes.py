"""split_indexes: after every pack[shard], each split's indexes over all its shards: its packed rows' global
shuffle, and litdata's and MDS's `index.json`."""

import pandas as pd
from prefect import task

from tasks import UNCACHED
from tokenmill.config import TokenmillConfig
from tokenmill.stages import pack
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo


@task(name="split_indexes", retries=2, **UNCACHED)
def split_indexes(config: TokenmillConfig, tokenizer: TokenizerInfo, table: pd.DataFrame) -> dict[str, int]:
    return pack.write_split_indexes(config, tokenizer, table)
