"""publish: `manifest.json`, written last."""

import pandas as pd
from prefect import task

from tokenmill import publish as library
from tokenmill.config import TokenmillConfig
from tokenmill.tokenizer import TokenizerInfo


@task(name="publish")
def publish(config: TokenmillConfig, tokenizer: TokenizerInfo, stats: list[dict]) -> dict:
    return library.publish(config, tokenizer, pd.DataFrame(stats))
