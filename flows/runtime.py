"""Where the flow runs: the Dask task runner built from `dask:` config, with the settings measured to
matter here (loopback-only dashboard, one thread per worker, no encoder thread oversubscription, no
hang when a worker dies)."""

from __future__ import annotations

import logging
import os

import dask
from prefect_dask import DaskTaskRunner

from tokenmill.config import DaskConfig

# LocalCluster closes a dead worker's slot for good after 15 s, and Prefect then waits forever on
# "Lost all workers"; a long timeout lets the nanny bring the worker back instead.
dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"})
# The cluster's start/stop chatter would drown the flow's own log lines; warnings still show.
logging.getLogger("distributed").setLevel(logging.WARNING)


def task_runner_for(dask_config: DaskConfig) -> DaskTaskRunner:
    """A DaskTaskRunner for an existing scheduler, or a LocalCluster of worker processes on 127.0.0.1."""
    address = dask_config.scheduler()
    if address:
        return DaskTaskRunner(address=address)
    cores = os.cpu_count() or 1
    n_workers = dask_config.n_workers or cores
    adaptive = dask_config.adaptive
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": adaptive.minimum if adaptive else n_workers,
            "threads_per_worker": 1,
            "processes": True,
            "host": "127.0.0.1",
            "dashboard_address": "127.0.0.1:0",
            "silence_logs": logging.ERROR,
            "memory_limit": dask_config.memory_limit,
            # The encoder's own thread pool gets this worker's share of the cores, no more.
            "env": {"RAYON_NUM_THREADS": str(max(1, cores // (adaptive.maximum if adaptive else n_workers)))},
        },
        adapt_kwargs={"minimum": adaptive.minimum, "maximum": adaptive.maximum} if adaptive else None,
    )
