"""scatter[input shards] and gather[output shards]: the optional global document shuffle."""

from tasks.shards import shard_task
from tokenmill import shuffle_documents

scatter_shards = shard_task("scatter", shuffle_documents.scatter_shard)  # (config, shards, n_outputs)
gather_shards = shard_task("gather", shuffle_documents.gather_shard)  # (config, targets, n_sources)
