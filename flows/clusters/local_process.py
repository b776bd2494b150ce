"""The LocalCluster's own process, once its workers' forkserver runs (`flows.clusters.local.serve_local_cluster`
starts it, then this): the cluster's scheduler and nannies, the dashboard's pages added once the flow has the
scheduler's address, and closed so that no open tab gets a traceback."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import multiprocessing
import multiprocessing.util
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

import dask
import distributed.utils
from distributed import LocalCluster
from distributed.comm.core import CommClosedError

from flows.clusters import DASHBOARD_ROUTES, ClusterStartError, attach_dashboard, private_scratch
from flows.dask_settings import WORKER_LOG_LENGTH
from flows.startup import without_collector

# LocalCluster closes a dead worker's slot for good after 15 s, and Prefect then waits forever on
# "Lost all workers"; a long timeout lets the nanny bring the worker back instead.
dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"})
# The scheduler's HTTP server serves read-only pages only (`flows.clusters.dashboard_routes`): not Dask's
# `/eventstream`, whose websocket adds a plugin to the scheduler for whoever opens it, nor its proxy to other ports.
dask.config.set({"distributed.scheduler.http.routes": DASHBOARD_ROUTES})

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

HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat"  # distributed.worker's words


class ClosedScheduler(logging.Filter):
    """Drops the traceback a LocalCluster's worker logs when its heartbeat finds the scheduler's connection closed.
    As the cluster closes at a run's end, a worker not yet told to close (on a loaded machine) can heartbeat while
    the scheduler closes, and `distributed.worker` logged that error with a CommClosedError's traceback on the
    run's terminal after the run had finished. The scheduler lives in the process of the workers' nannies, so
    its connections close only as the cluster does (a scheduler lost mid-run, the flow says so in its own words);
    a heartbeat's other failures still show. Installed in the workers' forkserver (`forkserver_preload`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, CommClosedError) and record.getMessage().startswith(HEARTBEAT_FAILED))


# Worker processes fork from a server that has imported what every worker needs (flows.clusters.local starts it),
# instead of each starting a fresh interpreter and importing it all again.
if "forkserver" in multiprocessing.get_all_start_methods():  # Linux and macOS; not Windows
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})


def forkserver_preloaded() -> None:
    """Tell Dask that the workers' forkserver has its preload: it runs with tokenmill's (`serve_local_cluster`). Dask's
    first nanny would otherwise import pandas, numpy and lz4 in this process only to name them in a preload list that
    a running forkserver never reads (and that would replace tokenmill's, were it restarted): 0.14 s of this process's
    CPU as a run starts."""
    distributed.utils._forkserver_preload_set = True


def start_local_cluster(kwargs: dict, adapt: dict | None) -> LocalCluster:
    """A LocalCluster made with `kwargs` (`local_cluster_kwargs`), adapting between `adapt`'s bounds if given. Its
    scheduler serves HTTP at the dashboard's address, but the dashboard's pages come later (`attach_dashboard`).

    It speaks TLS with a key and certificate made for it now, in memory (`Security.temporary`): on a shared host
    anyone can connect to 127.0.0.1, and a client of the scheduler runs code as the run's user; only the run's own
    processes hold the key.

    Its scratch space (the scheduler's and the workers' `dask-scratch-space`, their lock files) is in a directory made
    for the run (`scratch_directory`), not Dask's default, a fixed name anyone on the host can make first."""
    from distributed.security import Security

    scratch = scratch_directory()
    kwargs = kwargs | {
        "local_directory": scratch,
        "scheduler_kwargs": {"dashboard": False},
        "config": WORKER_LOG_LENGTH,  # the workers' config
        "security": Security.temporary(),
    }
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


def scratch_directory() -> str:
    """The run's Dask scratch space (`private_scratch`), made Dask's `temporary-directory` in this process (the
    scheduler's); removed as the process ends."""
    scratch = private_scratch()
    dask.config.set({"temporary-directory": scratch.name})
    SCRATCH.append(scratch)
    return scratch.name


SCRATCH: list[tempfile.TemporaryDirectory] = []  # the directories scratch_directory made in this process


def remove_scratch() -> None:
    for scratch in SCRATCH:
        scratch.cleanup()


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
    """The LocalCluster process's body once its forkserver runs (`flows.clusters.local.serve_local_cluster`):
    start the cluster `spec` describes, say its scheduler's address (or why it did not start) on stdout as a line
    of JSON, then keep it until stdin ends, which it does when the flow's process closes it or dies. Ctrl-C,
    which reaches the run's whole process group, ends it quietly, and the workers with it, as it ends the flow's
    process: with workers that went on, a shard group's wait for them outlived the flow's Dask client and the run
    never exited."""
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
            remove_scratch()
            sys.exit(1)
        tls = cluster.security  # the client's credentials, for the flow's process only (this pipe is its own)
        said = {"address": cluster.scheduler_address, "tls": [tls.tls_ca_file, tls.tls_client_cert, tls.tls_client_key]}
        print(json.dumps(said), file=answer, flush=True)
        answer.close()
        try:
            attach_dashboard(cluster)
        except Exception as e:  # the shards do not need it
            logging.getLogger(__name__).warning("the Dask dashboard did not start (%r): the run goes on without it", e)
        sys.stdin.read()
        close_dashboard(cluster)
        cluster.close()
    except KeyboardInterrupt:
        remove_scratch()
        # os._exit runs no exit handlers: multiprocessing's would remove its directory (the forkserver's socket in it),
        # which every Ctrl-C'd run left in the temporary directory
        shutil.rmtree(multiprocessing.util.get_temp_dir(), ignore_errors=True)
        os._exit(130)  # the flow's process reports the interruption; the workers got the same signal
    remove_scratch()
    gc.freeze()  # as the workers (QuickExit): no collector passes over the heap at exit
