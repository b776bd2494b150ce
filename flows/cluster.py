"""The flow's side of the Dask cluster its shards run on: which kind the run's `dask:` section asks for (one
module each in `flows.clusters`), the flow's client of it, and the workers made ready as the run starts."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from distributed import Client, fire_and_forget
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol.pickle import dumps

import flows.dask_settings  # noqa: F401 (applied to the flow's client, and to a scheduler it starts)
from flows.clusters import external, local, slurm
from flows.startup import warm_up
from tokenmill.core.client_waits import client_runs, on_client_loop
from tokenmill.core.tries import Sealed, peak_rss
from tokenmill.stages.report import load_plotting
from tokenmill.stages.validate import load_checking

if TYPE_CHECKING:
    from types import ModuleType

    from tokenmill.config import DaskConfig, TokenizerConfig


class ClosedWhileReconnecting(logging.Filter):
    """Drops the traceback Dask's client logs when it is closed while reconnecting: a run whose scheduler went first
    (Ctrl-C reaches the LocalCluster's process before the flow's, a scheduler lost mid-run) closes its client as it
    ends, which cancels the reconnection, and `distributed.client` logged that cancellation (CancelledError) with a
    traceback on the run's terminal under the run's own words for what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


logging.getLogger("distributed.client").addFilter(ClosedWhileReconnecting())

# The kinds of cluster, the first chosen wins: SLURM jobs, a scheduler at an address, else a LocalCluster.
KINDS = (slurm, external, local)


def kind(dask_config: DaskConfig) -> ModuleType:
    """The module of the kind of cluster `dask_config` asks for (`flows.clusters` says what each has)."""
    return next(k for k in KINDS if k.chosen(dask_config))


@contextlib.contextmanager
def dask_client(
    dask_config: DaskConfig, tokenizer: TokenizerConfig | None = None
) -> Iterator[tuple[Client, Callable[[], str | None]]]:
    """The process's default client, which the shard stages submit to, of the cluster `dask_config` asks for,
    started here (and closed after) where it is one of the run's own, and its `Running.release`; a LocalCluster's
    workers start with `tokenizer`'s encoders."""
    with kind(dask_config).start(dask_config, tokenizer) as running:
        with connect(running.address, running.security) as client:
            yield client, running.release


class SchedulerRefused(ConnectionError):
    """The flow could not become a client of the configured scheduler."""


def connect(address: str, security=None) -> Client:
    """The process's default client of the scheduler at `address`, with `security` or else Dask's TLS settings
    from its config (`tokenmill certs` says which); why not, in a sentence, where it cannot be."""
    try:
        client = Client(address, set_as_default=True, security=security)
        client.subscribe_topic(MEMORY_RESTART, MEMORY_RESTARTS.append)
        return client
    except TypeError as e:  # Dask's words for a tls:// address and no certificates in this process's config
        if "ssl_context" not in str(e):
            raise
        raise SchedulerRefused(
            f"the Dask scheduler at {address} speaks TLS and this process has no certificate for it: set "
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE, DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT and "
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY (`tokenmill certs DIR` makes them and prints how); "
            "nothing was run"
        ) from None
    except OSError as e:  # refused, timed out, or a TLS handshake the scheduler broke off
        raise SchedulerRefused(
            f"could not connect to the Dask scheduler at {address} ({type(e).__name__}: {e}); a scheduler with TLS "
            "refuses a client whose certificate its authority did not sign; nothing was run"
        ) from None


def prepare_cluster(client: Client) -> None:
    """Make the workers quick to exit (`QuickExit`) and have every worker import the shard stages and encoders
    now, while the flow partitions and chooses the encoder: a fresh worker spends about 2 s importing them
    when its first shard arrives. Neither is waited for: the plugin's registration is the scheduler's first
    message to each worker, which opens its connection to it (TLS), 0.1-0.4 s that the flow spent waiting, idle,
    as every run started. The scheduler keeps the plugin for workers that join later. And the worker that will draw
    the report's plots (`drawing_worker`) imports matplotlib now, before the run's shards come: 0.3 s of CPU that
    the end of every run waited for, the flow idle, when the plots' worker imported it as they were asked for; the
    one that will check the stats table (`checking_worker`) imports pandera (0.8 s)."""
    asyncio.run_coroutine_threadsafe(register_worker_plugin(client, QuickExit()), client.loop.asyncio_loop)
    workers = workers_now(client)
    for worker in workers:
        on_worker(client, worker, warm_up)
    if workers:
        on_worker(client, drawing_worker(workers), load_plotting)
        on_worker(client, checking_worker(workers), load_checking)


def drawing_worker(workers: list[str]) -> str | None:
    """Of the cluster's `workers` (addresses), the one that draws the report's plots: that one alone imports
    matplotlib (`prepare_cluster`). None: no workers."""
    return min(workers, default=None)


def checking_worker(workers: list[str]) -> str | None:
    """Of the cluster's `workers`, the one that checks the stats table (`tokenmill.stages.validate.stats_problems`):
    that one alone imports pandera (`prepare_cluster`); another than the drawing worker where there are two, so that
    the plots and the check run side by side. None: no workers."""
    return max(workers, default=None)


async def register_worker_plugin(client: Client, plugin: WorkerPlugin) -> None:
    """`client.register_plugin(plugin)`, as a coroutine for the client's event loop, for a caller that does not
    wait: the workers' answers are not read (QuickExit's setup does nothing that could fail)."""
    await client.scheduler.register_worker_plugin(plugin=dumps(plugin), name=plugin.name, idempotent=False)


class QuickExit(WorkerPlugin):
    """Workers that have imported Prefect, pandas and the encoders spent 0.3-0.7 s in the garbage collector's
    passes over the whole heap as they exited, which every run waited for when closing its cluster; frozen
    objects are skipped (their exit handlers still run). The workers unpickle it, importing this module: it
    imports nothing of Prefect (tests/test_shards.py checks the workers)."""

    name = "tokenmill-quick-exit"

    def teardown(self, worker) -> None:
        gc.freeze()


def on_every_worker(client: Client, work: Callable, *args) -> None:
    """Run `work(*args)` once on each worker the cluster has now, not awaited: the flow has other work
    meanwhile (a worker's shard tasks queue behind it)."""
    for worker in workers_now(client):
        on_worker(client, worker, work, *args)


def on_worker(client: Client, worker: str, work: Callable, *args) -> None:
    """Run `work(*args)` on the worker at address `worker`, not awaited."""
    fire_and_forget(client.submit(Sealed(work, *args), workers=[worker], pure=False))


def largest_process(client: Client, since: float) -> tuple[int, list[dict]]:
    """The largest peak resident memory, in bytes, of this process and the cluster's workers (a worker of a cluster
    that outlives runs counts its earlier runs too; this process's where the workers do not answer), and the workers
    their nanny restarted since `since` (a time.time()) for passing 95% of their memory limit, each `{"worker", "pid",
    "rss"}` as the nanny told the scheduler (a worker that is gone cannot say its peak: the nanny's count)."""
    try:
        workers = on_client_loop(client, client.run(peak_rss, asynchronous=True), alive=client_runs)
    except Exception:  # no scheduler connection, the client no longer runs, or a worker left under the question
        workers = {}
    restarted = [event for at, event in MEMORY_RESTARTS if at >= since]
    return max([peak_rss(), *workers.values(), *(event["rss"] for event in restarted)]), restarted


# The workers their nanny restarted for passing 95% of their memory limit while this process had a client, each
# (time, {"worker", "pid", "rss"}): the nanny's event (distributed.worker_memory), which the scheduler hands its
# subscribers as it comes and keeps no copy of (distributed.admin.low-level-log-length is 0: flows.dask_settings).
MEMORY_RESTART = "worker-restart-memory"
MEMORY_RESTARTS: list[tuple[float, dict]] = []


def workers_now(client: Client) -> list[str]:
    """The addresses of the cluster's workers, asked of the scheduler on the client's event loop; none once the
    client no longer runs. Dask's own `scheduler_info()` waits on that loop without end: called as a run ended
    and closed its client (the pretrained tokenizer's install finishing just after the partition failed), it
    never returned, and the run never exited (a test's run hung until killed at 300 s)."""
    try:
        return list(on_client_loop(client, client.scheduler.identity(n_workers=-1), alive=client_runs)["workers"])
    except Exception:  # no scheduler connection, the client no longer runs, or it closed under the question
        return []
