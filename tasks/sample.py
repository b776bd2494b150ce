"""sample[shards]: each shard's proportional part of the tokenizer training sample and of the held-out sample."""

from tasks.shards import shard_task
from tokenmill import sampling

sample_shards = shard_task("sample", sampling.sample_shard)  # (config, shards, train fraction, held-out fraction)
