"""The run's LocalCluster in a process of its own, started by `tokenmill run` (and by a flow run given no
scheduler) before Prefect is imported. Imports nothing beyond the standard library, so that the cluster's
process starts as early as the config is read; its body is `flows.cluster.serve_local_cluster`."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenmill.config import DaskConfig


def local_cluster_kwargs(dask_config: DaskConfig) -> dict:
    """LocalCluster arguments: worker processes on 127.0.0.1, one thread each."""
    cores = os.cpu_count() or 1
    n_workers = dask_config.n_workers or cores
    adaptive = dask_config.adaptive
    return {
        "n_workers": adaptive.minimum if adaptive else n_workers,
        "threads_per_worker": 1,
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": "127.0.0.1:0",
        "silence_logs": logging.ERROR,
        "memory_limit": dask_config.memory_limit,
        # The encoder's own thread pool gets this worker's share of the cores, no more.
        "env": {"RAYON_NUM_THREADS": str(max(1, cores // (adaptive.maximum if adaptive else n_workers)))},
    }


def local_cluster_threads(dask_config: DaskConfig) -> int:
    """The threads a LocalCluster's shards will have (an adaptive one's at its maximum)."""
    adaptive = dask_config.adaptive
    return adaptive.maximum if adaptive else local_cluster_kwargs(dask_config)["n_workers"]


def adapt_kwargs(dask_config: DaskConfig) -> dict | None:
    adaptive = dask_config.adaptive
    return {"minimum": adaptive.minimum, "maximum": adaptive.maximum} if adaptive else None


class ClusterStartError(RuntimeError):
    """The run's LocalCluster did not start."""


CLOSE_TIMEOUT_S = 60  # the most a run waits for its LocalCluster to close (it takes well under a second)


@contextlib.contextmanager
def local_cluster_process(dask_config: DaskConfig) -> Iterator[Callable[[], str]]:
    """Start the run's LocalCluster in a process of its own now and yield `address`, which waits for its
    scheduler's address; on exit the cluster is closed. Its own interpreter, because the scheduler, the
    nannies and the dashboard (bokeh) took 0.6 s of CPU to start and more as they run, which in the flow's
    process delayed its imports and its own work (every process's CPU is measured in bench/megatron.py).
    The cluster's process ends with the flow's, killed or not: it closes the cluster when its stdin ends."""
    spec = json.dumps({"cluster": local_cluster_kwargs(dask_config), "adapt": adapt_kwargs(dask_config)})
    command = [sys.executable, "-c", "import sys; from flows.cluster import serve_local_cluster as s; s(sys.argv[1])"]
    process = subprocess.Popen([*command, spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    @functools.cache
    def address() -> str:
        said = json.loads(process.stdout.readline() or "{}")
        if "address" in said:
            return said["address"]
        raise ClusterStartError(
            said.get("error")
            or f"the local Dask cluster's process ended before its cluster started "
            f"(exit code {process.wait()}); nothing was run: run the same command again"
        )

    try:
        yield address
    finally:
        process.stdin.close()
        try:
            process.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def local_cluster_started_early(dask_config: DaskConfig) -> Iterator[Callable[[], None]]:
    """With no scheduler configured, start the run's LocalCluster now (`local_cluster_process`), so that it
    boots while the caller imports Prefect (about 2 s of a `tokenmill run`), and yield `connect`, which waits
    for it and points TOKENMILL_DASK_ADDRESS at it; the cluster is closed on exit. With a scheduler,
    `connect` does nothing."""
    if dask_config.scheduler():
        yield lambda: None
        return
    with local_cluster_process(dask_config) as address:

        def connect() -> None:
            os.environ["TOKENMILL_DASK_ADDRESS"] = address()

        try:
            yield connect
        finally:
            os.environ.pop("TOKENMILL_DASK_ADDRESS", None)
