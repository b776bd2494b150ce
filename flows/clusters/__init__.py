"""The kinds of Dask cluster a run's shards can run on, one module each, every one with the same three names:

- `chosen(dask_config)`: whether the run's `dask:` section asks for this kind;
- `threads(dask_config)`: the threads its shards will have at its configured size (`shard_size: auto` plans
  for them; 1 where only the running cluster can tell);
- `start(dask_config, tokenizer)`: a context manager that starts the cluster, or finds it, and yields its
  `Running` (the scheduler's address, the TLS to reach it with, and how to let its workers go early); on exit it
  closes what it started.

`flows.cluster` takes the first kind of its `KINDS` that is chosen: adding a kind is a module here and a line
there. The kinds import this package, never each other nor `flows.cluster`."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from distributed import SpecCluster
    from distributed.security import Security


def keep_workers() -> str | None:
    """The release of a cluster whose workers the run keeps to its end."""
    return None


class Running(NamedTuple):
    """A started (or found) cluster: its scheduler's address, the TLS to speak to it with (None: Dask's config's,
    which `tokenmill certs` says how to set, or none), and `release`, which lets go of workers the run holds on a
    shared system once the shard work is done (publish runs in the flow's process) and says what it let go of
    (None: it keeps them, as a LocalCluster or a scheduler at an address does)."""

    address: str
    security: Security | None = None
    release: Callable[[], str | None] = keep_workers


class ClusterStartError(RuntimeError):
    """The run's cluster did not start."""


def private_scratch() -> tempfile.TemporaryDirectory:
    """A new directory of mode 0700, under a name no one can take first, for the scratch space (`dask-scratch-space`,
    its lock files) of a scheduler or workers tokenmill starts, in Dask's `temporary-directory` (else the system's);
    the caller makes it that setting where they start, and removes it (`cleanup`, or as a context manager). Dask's
    default is a fixed name in the temporary directory that any user of the host can make first: a link another user
    planted there as `global.lock` had a run truncate the file it pointed at."""
    import dask

    where = dask.config.get("temporary-directory", None)
    return tempfile.TemporaryDirectory(prefix="tokenmill-dask-", dir=where, ignore_cleanup_errors=True)


# The HTTP routes of the schedulers tokenmill starts (Dask's `distributed.scheduler.http.routes`): its read-only pages,
# without `/eventstream` and the proxy (`flows.clusters.dashboard_routes`).
DASHBOARD_ROUTES = [
    "distributed.http.scheduler.prometheus",
    "flows.clusters.dashboard_routes",
    "distributed.http.scheduler.json",
    "distributed.http.health",
    "distributed.http.statics",
]


# A dashboard's websockets take pages of its own address only (Dask's default: any page of any site a browser on the
# host shows, which then drives the dashboard as the person browsing). Where the port is not known as the dashboard
# starts (a worker's, on its node): [] is Bokeh's `localhost:<its port>`.
WEBSOCKET_ORIGINS = "distributed.scheduler.dashboard.bokeh-application.allow_websocket_origin"
OWN_ORIGIN_ONLY = {"DASK_DISTRIBUTED__SCHEDULER__DASHBOARD__BOKEH_APPLICATION__ALLOW_WEBSOCKET_ORIGIN": "[]"}


def attach_dashboard(cluster: SpecCluster) -> None:
    """Add the dashboard's pages (bokeh) to the running scheduler's HTTP server (started without them,
    `dashboard=False`, at an address the run chose), as Dask does when it starts one with a dashboard, taking
    websockets of pages of its own address only (`127.0.0.1:<port>`, `localhost:<port>`: through `ssh -L`, forward
    the same port). Bokeh's import and applications cost 0.45 s of CPU: done once the cluster has said its address,
    they come while the flow plans and chooses its encoder."""
    import dask
    import distributed.dashboard.scheduler

    scheduler = cluster.scheduler

    async def attach() -> None:
        distributed.dashboard.scheduler.connect(scheduler.http_application, scheduler.http_server, scheduler, "/")

    port = scheduler.http_server.port
    with dask.config.set({WEBSOCKET_ORIGINS: [f"127.0.0.1:{port}", f"localhost:{port}"]}):
        cluster.sync(attach)
