"""validate: counts reconcile and files are sound, or the run fails with a readable report."""

import pandas as pd
from prefect import task

from tokenmill import validate as library
from tokenmill.config import TokenmillConfig
from tokenmill.tokenizer import TokenizerInfo


@task(name="validate")
def validate(config: TokenmillConfig, plan: dict, tokenizer: TokenizerInfo, table: pd.DataFrame) -> pd.DataFrame:
    return library.validate(config, plan, tokenizer, table)
