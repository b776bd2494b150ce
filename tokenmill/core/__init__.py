"""The core every stage stands on: the plan and its shards, the commit markers and stage keys, where every file
lives (layout), a shard's results and the stats table, the packing modes, the hashes that choose splits, a
mixture's shares, what a run signs, the sample files, how a shard's work is tried on a worker (tries), and the
flow's waits on its Dask client (client_waits)."""
