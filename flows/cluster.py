"""The Dask side of where the flow runs, with the settings measured to matter here (loopback-only dashboard,
one thread per worker, no encoder thread oversubscription, glibc's adaptive malloc, no hang when a worker
dies, workers forked from a preloaded forkserver, quick worker exits, Dask's housekeeping at low rates), and the
body of the LocalCluster's own process (`flows.local_cluster` starts it)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import dask
from distributed import Client, LocalCluster, fire_and_forget
from distributed.diagnostics.plugin import WorkerPlugin

from flows.local_cluster import ClusterStartError, local_cluster_process, warm_up, without_collector
from tokenmill.tries import Sealed

if TYPE_CHECKING:
    from tokenmill.config import DaskConfig, TokenizerConfig

# LocalCluster closes a dead worker's slot for good after 15 s, and Prefect then waits forever on
# "Lost all workers"; a long timeout lets the nanny bring the worker back instead.
dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"})
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
# The cluster's start/stop chatter would drown the flow's own log lines; warnings still show.
logging.getLogger("distributed").setLevel(logging.WARNING)


BOKEH_CONNECTION = ("bokeh", "server", "connection.py")


class ClosedDashboardTab(logging.Filter):
    """Drops the traceback Bokeh (3.9) logs when a browser tab showing the Dask dashboard closes, which lands in
    the terminal of the process running the LocalCluster's scheduler (`tokenmill run`). Bokeh races itself:
    its keep-alive ping (every 500 ms in Dask's settings) finds the closing socket and detaches the session;
    then a message the page sent just before closing, and the socket's `on_close`, read the detached session
    (`ServerConnection.session` asserts it is set): bokeh logs "error handling message" and tornado
    "Uncaught exception GET /status/ws", each with the AssertionError's traceback. The connection is cleaned
    up either way; other errors of the dashboard still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, AssertionError):
            return True
        frames = traceback.extract_tb(error.__traceback__)
        if not frames:
            return True
        return not (frames[-1].name == "session" and Path(frames[-1].filename).parts[-3:] == BOKEH_CONNECTION)


for _name in ("tornado.application", "bokeh.server.protocol_handler", "bokeh.server.views.ws"):
    logging.getLogger(_name).addFilter(ClosedDashboardTab())


# Worker processes fork from a server that has imported what every worker needs (flows.local_cluster starts it),
# instead of each starting a fresh interpreter and importing it all again.
if "forkserver" in multiprocessing.get_all_start_methods():  # Linux and macOS; not Windows
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})


def start_local_cluster(kwargs: dict, adapt: dict | None) -> LocalCluster:
    """A LocalCluster made with `kwargs` (`local_cluster_kwargs`), adapting between `adapt`'s bounds if given. Its
    scheduler serves HTTP at the dashboard's address, but the dashboard's pages come later (`attach_dashboard`)."""
    kwargs = kwargs | {"scheduler_kwargs": {"dashboard": False}, "config": WORKER_LOG_LENGTH}  # the workers' config
    try:
        cluster = LocalCluster(**kwargs)
    except RuntimeError:  # a worker process died as it started (killed, out of memory): once more
        try:
            cluster = LocalCluster(**kwargs)
        except RuntimeError as e:
            reason = "; ".join(dict.fromkeys(str(c) for c in (e, e.__cause__) if c))
            raise ClusterStartError(
                f"the local Dask cluster could not start, twice ({reason}: a worker process died as it started); "
                "nothing was run: run the same command again"
            ) from None
    if adapt:
        cluster.adapt(**adapt)
    return cluster


def attach_dashboard(cluster: LocalCluster) -> None:
    """Add the dashboard's pages (bokeh) to the running scheduler's HTTP server, as Dask does when it starts one
    with a dashboard. Importing bokeh and building its applications took 0.45 s of CPU as the cluster started, on
    every run's start-up, which the flow's own imports needed; once the cluster has said its address, the pages
    come while the flow plans and chooses its encoder, a second or so into the run."""
    import distributed.dashboard.scheduler

    scheduler = cluster.scheduler

    async def attach() -> None:
        distributed.dashboard.scheduler.connect(scheduler.http_application, scheduler.http_server, scheduler, "/")

    cluster.sync(attach)


DASHBOARD_CLOSE_S = 5.0  # the most a run's end waits for its dashboard's tabs to let go (they take milliseconds)
BOKEH_WEBSOCKET = ("bokeh", "server", "views", "ws.py")


def close_dashboard(cluster: LocalCluster) -> None:
    """Close the dashboard's websockets, and wait until their handlers are done, before the cluster's event loop
    ends. A tab still open at a run's end could be mid-way through a message (a page's document, sent as it
    opens): the loop's end cancelled that write, and tornado logged the CancelledError's traceback ("Uncaught
    exception GET /status/ws") on the run's terminal. Bokeh's server does not close its connections when it
    stops (its `BokehTornado.stop` says so), so this does: no new tab or request, then a close frame to each
    open tab (it goes out after any write in flight), until no tab is connected and no websocket handler is
    running (a tab that was opening meanwhile is closed in a later pass). With no tab open it returns at once."""
    from bokeh.server.tornado import BokehTornado

    scheduler = cluster.scheduler
    pages = [app for app in scheduler.http_application.applications if isinstance(app, BokehTornado)]

    def handling() -> bool:
        """Whether a websocket handler of Bokeh's is running: a tab opening, or a message being answered."""
        codes = (getattr(task.get_coro(), "cr_code", None) for task in asyncio.all_tasks())
        return any(code and Path(code.co_filename).parts[-4:] == BOKEH_WEBSOCKET for code in codes)

    async def close() -> None:
        scheduler.http_server.stop()  # no new connection
        await scheduler.http_server.close_all_connections()  # nor a new request on a kept-alive one
        deadline = asyncio.get_running_loop().time() + DASHBOARD_CLOSE_S
        while asyncio.get_running_loop().time() < deadline:
            connections = [c for app in pages for c in app._clients]
            if not connections and not handling():
                break
            for connection in connections:
                connection._socket.close(1001, "the run ended")  # 1001: going away; once more is a no-op
            await asyncio.sleep(0.02)
        for app in pages:
            app.stop()

    cluster.sync(close)


def run_local_cluster(spec: str) -> None:
    """The LocalCluster process's body once its forkserver runs (`local_cluster_process`, then
    `flows.local_cluster.serve_local_cluster`): start the cluster `spec` describes, say its
    scheduler's address (or why it did not start) on stdout as a line of JSON, then keep it until stdin ends,
    which it does when the flow's process closes it or dies. Ctrl-C, which reaches the run's whole process
    group, ends it quietly, and the workers with it, as it ends the flow's process: with workers that went on,
    a shard group's wait for them outlived the flow's Dask client and the run never exited."""
    # The answer gets stdout's pipe; everything else printed here or in the workers goes to stderr (a pipe no
    # one reads would fill and block its writer).
    answer = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    spec = json.loads(spec)
    try:
        try:
            with without_collector():
                cluster = start_local_cluster(spec["cluster"], spec["adapt"])
        except ClusterStartError as e:
            print(json.dumps({"error": str(e)}), file=answer, flush=True)
            sys.exit(1)
        print(json.dumps({"address": cluster.scheduler_address}), file=answer, flush=True)
        answer.close()
        try:
            attach_dashboard(cluster)
        except Exception as e:  # the shards do not need it
            logging.getLogger(__name__).warning("the Dask dashboard did not start (%r): the run goes on without it", e)
        sys.stdin.read()
        close_dashboard(cluster)
        cluster.close()
    except KeyboardInterrupt:
        os._exit(130)  # the flow's process reports the interruption; the workers got the same signal
    gc.freeze()  # as the workers (QuickExit): no collector passes over the heap at exit


@contextlib.contextmanager
def dask_client(dask_config: DaskConfig, tokenizer: TokenizerConfig | None = None) -> Iterator[Client]:
    """A client of the scheduler `dask_config` names, or of a cluster started (and closed) here: SLURM jobs
    (`flows.slurm_cluster`), else a LocalCluster whose workers start with `tokenizer`'s encoders; it is the
    process's default client, which the shard stages submit to."""
    with contextlib.ExitStack() as stack:
        if dask_config.slurm is not None:
            from flows.slurm_cluster import slurm_cluster

            cluster = stack.enter_context(slurm_cluster(dask_config))
            yield stack.enter_context(connect(cluster.scheduler_address, cluster.security))
            return
        address = dask_config.scheduler() or stack.enter_context(local_cluster_process(dask_config, tokenizer))()
        yield stack.enter_context(connect(address))


class SchedulerRefused(ConnectionError):
    """The flow could not become a client of the configured scheduler."""


def connect(address: str, security=None) -> Client:
    """The process's default client of the scheduler at `address`, with `security` or else Dask's TLS settings
    from its config (`tokenmill certs` says which); why not, in a sentence, where it cannot be."""
    try:
        return Client(address, set_as_default=True, security=security)
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
    when its first shard arrives."""
    client.register_plugin(QuickExit())
    on_every_worker(client, warm_up)


def on_every_worker(client: Client, work: Callable, *args) -> None:
    """Run `work(*args)` once on each worker the cluster has now, not awaited: the flow has other work
    meanwhile (a worker's shard tasks queue behind it)."""
    for worker in client.scheduler_info()["workers"]:
        fire_and_forget(client.submit(Sealed(work, *args), workers=[worker], pure=False))


class QuickExit(WorkerPlugin):
    """Workers that have imported Prefect, pandas and the encoders spent 0.3-0.7 s in the garbage collector's
    passes over the whole heap as they exited, which every run waited for when closing its cluster; frozen
    objects are skipped (their exit handlers still run)."""

    name = "tokenmill-quick-exit"

    def teardown(self, worker) -> None:
        gc.freeze()
