"""shuffle_index: after every pack[shard], each split's global shuffle index over its packed rows."""

import pandas as pd
from prefect import task

from tasks import UNCACHED
from tokenmill import pack
from tokenmill.config import TokenmillConfig


@task(name="shuffle_index", retries=2, **UNCACHED)
def shuffle_index(config: TokenmillConfig, table: pd.DataFrame) -> dict[str, int]:
    return pack.write_shuffle_indexes(config, table)
