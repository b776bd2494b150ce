"""tokenize[shard]: one shard to Megatron `.bin/.idx` per split, plus rejects and counts."""

from prefect import task

from tokenmill import tokenize
from tokenmill.config import TokenmillConfig
from tokenmill.tokenizer import TokenizerInfo


@task(name="tokenize", task_run_name="tokenize[shard-{shard[shard_id]:05d}]", retries=2)
def tokenize_shard(config: TokenmillConfig, shard: dict, tokenizer: TokenizerInfo) -> dict:
    return tokenize.tokenize_shard(config, shard, tokenizer)
