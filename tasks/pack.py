"""pack[shard]: a tokenized shard packed into fixed-length rows with their boundaries (and llm.c files)."""

from prefect import task

from tokenmill import pack
from tokenmill.config import TokenmillConfig
from tokenmill.tokenizer import TokenizerInfo


@task(name="pack", task_run_name="pack[shard-{tokenized[shard_id]:05d}]", retries=2)
def pack_shard(config: TokenmillConfig, tokenized: dict, tokenizer: TokenizerInfo) -> dict:
    return pack.pack_shard(config, tokenized, tokenizer)
