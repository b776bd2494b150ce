"""pack[shards]: tokenized shards packed into fixed-length rows with their boundaries (and llm.c files)."""

from tasks.shards import shard_task
from tokenmill import pack

pack_shards = shard_task("pack", pack.pack_shard)  # (config, tokenize results, tokenizer)
