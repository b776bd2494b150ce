"""tokenize[shard]: one shard to Megatron `.bin/.idx` per split, plus rejects and counts; and the run's
encoder choice, made once before any shard (verified on a sample across shards)."""

from prefect import get_run_logger, task

from tokenmill import tokenize
from tokenmill.config import TokenmillConfig
from tokenmill.encoders import EncoderChoice
from tokenmill.tokenizer import TokenizerInfo


@task(name="choose_encoder")
def choose_encoder(config: TokenmillConfig, shards: list[dict], tokenizer: TokenizerInfo) -> EncoderChoice:
    return tokenize.choose_run_encoder(config, shards, tokenizer, log=get_run_logger().info)


@task(name="tokenize", task_run_name="tokenize[shard-{shard[shard_id]:05d}]", retries=2)
def tokenize_shard(
    config: TokenmillConfig, shard: dict, tokenizer: TokenizerInfo, encoder: EncoderChoice | None = None
) -> dict:
    return tokenize.tokenize_shard(config, shard, tokenizer, encoder)
