"""validate: counts reconcile and files are sound, or the run fails with a readable report."""

from prefect import task

from tokenmill import validate as library
from tokenmill.config import TokenmillConfig
from tokenmill.tokenizer import TokenizerInfo


@task(name="validate")
def validate(
    config: TokenmillConfig, plan: dict, tokenizer: TokenizerInfo, tokenized: list[dict], packed: list[dict]
) -> list[dict]:
    return library.validate(config, plan, tokenizer, tokenized, packed).to_dict(orient="records")
