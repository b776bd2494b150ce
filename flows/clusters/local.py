"""The run's LocalCluster in a process of its own, started by `tokenmill run` (and by a flow run given no
scheduler) before Prefect is imported. Imports nothing beyond the standard library, so that the cluster's
process starts as early as the config is read: its workers' forkserver first (`serve_local_cluster`), then the
cluster itself (`flows.clusters.local_process`)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

from flows.clusters import ClusterStartError, Running
from flows.startup import without_collector

if TYPE_CHECKING:
    from tokenmill.config import DaskConfig, TokenizerConfig

# The LocalCluster `tokenmill run` started ahead of its flow, which runs in the same context: the flow's `start`
# takes it rather than start another. Its TLS credentials exist only in the memory of the run's processes.
STARTED_EARLY: ContextVar[Running | None] = ContextVar("tokenmill_local_cluster", default=None)

# The run's tokenizer config, for the forkserver's `flows.clusters.forkserver_preload`.
FORKSERVER_TOKENIZER = "TOKENMILL_FORKSERVER_TOKENIZER"


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


def client_tls(ca: str, cert: str, key: str):
    """A client's TLS to the run's LocalCluster, from the certificate and key it was made with (PEM text)."""
    from distributed.security import Security

    return Security(require_encryption=True, tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key)


def chosen(dask_config: DaskConfig) -> bool:
    return True  # the kind a run gets when it asks for no other


def threads(dask_config: DaskConfig) -> int:
    """The threads a LocalCluster's shards will have (an adaptive one's at its maximum)."""
    adaptive = dask_config.adaptive
    return adaptive.maximum if adaptive else local_cluster_kwargs(dask_config)["n_workers"]


def adapt_kwargs(dask_config: DaskConfig) -> dict | None:
    adaptive = dask_config.adaptive
    return {"minimum": adaptive.minimum, "maximum": adaptive.maximum} if adaptive else None


CLOSE_TIMEOUT_S = 60  # the most a run waits for its LocalCluster to close (it takes well under a second)


def preloaded_tokenizer(tokenizer: TokenizerConfig | None) -> str | None:
    """The tokenizer config (as JSON) for the workers' forkserver to load, when it names a pretrained tokenizer
    on this machine's disk (one on the hub or in object storage is loaded where the run installs it)."""
    path = tokenizer.path if tokenizer is not None and tokenizer.train is None else None
    return tokenizer.model_dump_json() if path and "://" not in path and os.path.exists(path) else None


def serve_local_cluster(spec: str) -> None:
    """The LocalCluster process's body: the workers' forkserver started first, so that it imports what they need
    (and loads the run's tokenizer) while this process imports Dask and starts the scheduler, then the
    cluster (`flows.clusters.local_process`). The forkserver, started later, had each worker wait for it:
    with the tokenizer to load too, the run waited 0.3 s longer for its cluster."""
    tokenizer = json.loads(spec)["tokenizer"]
    import multiprocessing.forkserver

    forkserver = "forkserver" in multiprocessing.get_all_start_methods()  # Linux and macOS; not Windows
    if forkserver:
        if tokenizer:
            os.environ[FORKSERVER_TOKENIZER] = tokenizer  # the forkserver's environment is this process's
        multiprocessing.get_context("forkserver").set_forkserver_preload(["flows.clusters.forkserver_preload"])
        multiprocessing.forkserver.ensure_running()  # now, with these: Dask's own preload list would replace them
        os.environ.pop(FORKSERVER_TOKENIZER, None)
    with without_collector():
        from flows.clusters.local_process import forkserver_preloaded, run_local_cluster

    if forkserver:
        forkserver_preloaded()
    run_local_cluster(spec)


@contextlib.contextmanager
def local_cluster_process(
    dask_config: DaskConfig, tokenizer: TokenizerConfig | None = None
) -> Iterator[Callable[[], Running]]:
    """Start the run's LocalCluster in a process of its own now and yield `started`, which waits for its
    scheduler's address and the TLS to reach it with; on exit the cluster is closed. Its own interpreter, because
    the scheduler, the nannies and the dashboard (bokeh) took 0.6 s of CPU to start and more as they run, which in
    the flow's process delayed its imports and its own work (every process's CPU is measured in bench/megatron.py).
    The cluster's process ends with the flow's, killed or not: it closes the cluster when its stdin ends.
    `tokenizer`: the run's, whose encoders every worker then starts with (`preloaded_tokenizer`)."""
    spec = json.dumps(
        {
            "cluster": local_cluster_kwargs(dask_config),
            "adapt": adapt_kwargs(dask_config),
            "tokenizer": preloaded_tokenizer(tokenizer),
        }
    )
    body = "import sys; from flows.clusters.local import serve_local_cluster as s; s(sys.argv[1])"
    # -P: the working directory is not on sys.path (`python -c` puts it first), so a project's own `flows/` or `tasks/`
    # (a Prefect project's) is not imported for tokenmill's, here or in the workers' forkserver, which takes this
    # process's sys.path
    # -W: Ctrl-C ends this process at once (`local_process.run_local_cluster`), before its nannies' queues are closed;
    # multiprocessing's resource tracker then removes their semaphores, and would say so on the run's terminal
    # ("resource_tracker: There appear to be 12 leaked semaphore objects to clean up at shutdown", a UserWarning
    # with its source line). The tracker takes this process's warning options.
    command = [sys.executable, "-P", "-W", "ignore:resource_tracker:UserWarning", "-c", body]
    process = subprocess.Popen([*command, spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    @functools.cache
    def started() -> Running:
        said = json.loads(process.stdout.readline() or "{}")
        if "address" in said:
            return Running(said["address"], client_tls(*said["tls"]))
        raise ClusterStartError(
            said.get("error")
            or f"the local Dask cluster's process ended before its cluster started "
            f"(exit code {process.wait()}); nothing was run: run the same command again"
        )

    try:
        yield started
    finally:
        process.stdin.close()
        try:
            process.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def local_cluster_started_early(
    dask_config: DaskConfig, tokenizer: TokenizerConfig | None = None
) -> Iterator[Callable[[], None]]:
    """With no scheduler configured, start the run's LocalCluster now (`local_cluster_process`), so that it
    boots while the caller imports Prefect (about 2 s of a `tokenmill run`), and yield `connect`, which waits
    for it and makes it the one the flow's `start` takes (`STARTED_EARLY`); the cluster is closed on exit.
    With a scheduler, or SLURM jobs (the flow starts those), `connect` does nothing."""
    if dask_config.scheduler() or dask_config.slurm is not None:
        yield lambda: None
        return
    with local_cluster_process(dask_config, tokenizer) as started:

        def connect() -> None:
            STARTED_EARLY.set(started())

        try:
            yield connect
        finally:
            STARTED_EARLY.set(None)


@contextlib.contextmanager
def start(dask_config: DaskConfig, tokenizer: TokenizerConfig | None = None) -> Iterator[Running]:
    """The run's LocalCluster: the one `tokenmill run` started ahead of the flow (`local_cluster_started_early`),
    else one started now (`local_cluster_process`), for a flow run that has none (a deployment's)."""
    if (early := STARTED_EARLY.get()) is not None:
        yield early
        return
    with local_cluster_process(dask_config, tokenizer) as started:
        yield started()
