"""tokenize[shards]: each shard to Megatron `.bin/.idx` per split, plus rejects and counts; and the run's
encoder choice, made once before any shard (verified on a sample across shards)."""

from prefect import get_run_logger, task

from tasks.shards import shard_task
from tokenmill import tokenize
from tokenmill.config import TokenmillConfig
from tokenmill.encoders import EncoderChoice
from tokenmill.tokenizer import TokenizerInfo


@task(name="choose_encoder")
def choose_encoder(config: TokenmillConfig, shards: list[dict], tokenizer: TokenizerInfo) -> EncoderChoice:
    return tokenize.choose_run_encoder(config, shards, tokenizer, log=get_run_logger().info)


tokenize_shards = shard_task("tokenize", tokenize.tokenize_shard)  # (config, shards, tokenizer, encoder)
