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

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
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


# The HTTP routes of the schedulers tokenmill starts (Dask's `distributed.scheduler.http.routes`): its read-only pages,
# without `/eventstream` and the proxy (`flows.clusters.dashboard_routes`).
DASHBOARD_ROUTES = [
    "distributed.http.scheduler.prometheus",
    "flows.clusters.dashboard_routes",
    "distributed.http.scheduler.json",
    "distributed.http.health",
    "distributed.http.statics",
]
