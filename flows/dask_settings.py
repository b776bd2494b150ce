"""The Dask settings measured to matter here, applied where tokenmill's schedulers and clients run (the flow's
process, the LocalCluster's) and handed to workers tokenmill starts elsewhere (`WORKER_ENVIRONMENT`): one thread
per worker and no encoder thread oversubscription, glibc's adaptive malloc, no memory pause, short debugging
logs, Dask's housekeeping at low rates, shard tasks known to be long. infra/ gives its scheduler and workers the
same as environment variables."""

from __future__ import annotations

import logging

import dask
import distributed  # noqa: F401 (registers the defaults these settings change)

# Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, which also turns off glibc's adaptive mmap
# threshold: every buffer over 128 KiB is then a fresh mmap, page-faulted in and returned at once. The tokenize
# stage, which reads and encodes 8 MB batches, ran 33% slower so (0.73 against 0.55 s per 64 MB shard); its
# memory is bounded by batch size anyway. External workers take the same setting from the environment:
# DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON="{'MALLOC_TRIM_THRESHOLD_': None}" (see infra/).
dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None})
# A worker over 80% of dask.memory_limit pauses until its memory falls back, which a finished shard's memory
# (freed to glibc, not to the system: see above) need not do. A fault campaign run with a 476 MiB limit and a
# 40 MB document sat with its tokenize groups waiting until it was killed at 600 s, most likely so. Shard
# results are files, so there is nothing to spill either; the nanny still restarts a worker at 95%, and a shard
# whose workers keep dying fails naming its memory (tasks.shards). External workers take the same settings from
# DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE=False and ..._SPILL=False (see infra/).
dask.config.set({"distributed.worker.memory.pause": False, "distributed.worker.memory.spill": False})
# Dask keeps the last 1,000 messages of each batched connection, and other logs of that length, for debugging
# (admin.low-level-log-length). The scheduler, in the flow's process, so kept nearly every compute-task message
# of a run, each with its task's arguments (a bundle's shard dicts), and the client the pickled graphs it sent:
# 58 and 8 MB at 20,002 shards by the end of validate, 3.3 KB a shard (tracemalloc; issue 12). tokenmill reads
# none of these logs. An external scheduler takes the same setting from
# DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH=0 (see infra/). Workers keep theirs: the history of their
# Profile page is one of these logs, which a length of 0 left empty.
LOG_LENGTH = "distributed.admin.low-level-log-length"
WORKER_LOG_LENGTH = {LOG_LENGTH: dask.config.get(LOG_LENGTH)}
dask.config.set({LOG_LENGTH: 0})
# Dask's housekeeping in every worker, nanny and scheduler: a profiler sampling each worker's threads every 10 ms
# (the dashboard's Profile page), an event-loop tick every 20 ms (to warn of a blocked loop) and a system monitor
# every 500 ms (the dashboard's CPU and memory graphs). Each wakes its process's event loop, and the profiler
# takes the interpreter lock from the thread running a shard: on the 1.19 GB benchmark they cost 1.6 s of a
# run's 17 s of CPU, 0.8 s of its 10 s of wall time. Ten samples a second still fill the Profile page, a tick a
# second still catches the 3 s blocked loop Dask warns of, and the graphs move every second. External clusters
# take the same settings from DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL=100ms, ...__ADMIN__TICK__INTERVAL=1s
# and ...__ADMIN__SYSTEM_MONITOR__INTERVAL=1s (see infra/).
HOUSEKEEPING = {
    "distributed.worker.profile.interval": "100ms",
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "1s",
}
dask.config.set(HOUSEKEEPING)
# Dask takes a task it has not yet seen end for 0.5 s (distributed.scheduler.unknown-task-duration), and learns how
# long a running one has run only from its worker's heartbeats. A worker whose shard had just started so looked less
# busy than one running sample tasks already timed, and it was given the next shard too: of a run of two shards (a
# .jsonl.gz cut in two), both on one worker, one after the other, in about 1 of 5 runs (24 s against 18; the other
# worker idle). A shard's task is long: said so, the next shard goes to the worker that will be free first.
# tests/test_shards.py. An external scheduler takes the same setting from
# DASK_DISTRIBUTED__SCHEDULER__DEFAULT_TASK_DURATIONS (see infra/).
SHARD_DURATIONS = {
    f"distributed.scheduler.default-task-durations.{name}-shard": "60s" for name in ("tokenize", "scatter", "gather")
}
dask.config.set(SHARD_DURATIONS)
# The cluster's start/stop chatter would drown the flow's own log lines; warnings still show.
logging.getLogger("distributed").setLevel(logging.WARNING)
# What tokenmill's LocalCluster workers have (above, and one encoder thread per worker process), as environment
# variables for workers started elsewhere (SLURM jobs); infra/ sets the same.
WORKER_ENVIRONMENT = {
    "RAYON_NUM_THREADS": "1",
    "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON": "{'MALLOC_TRIM_THRESHOLD_': None}",
    "DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "False",
    "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False",
    "DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL": "100ms",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "1s",
}
