"""A Dask preload that holds each certificate of `tokenmill certs` to its role: a worker's cannot do what only a
client or the scheduler does.

TLS tells Dask that a peer holds a certificate of the cluster's authority, not which one. A worker's certificate
must serve and connect (its peers fetch data from it; it reports to the scheduler), so its usage alone cannot keep
it from acting as a client: submitting work, running functions on the scheduler or on every worker, adding
plugins. Whoever takes one worker's key would run code as the run's user on all of them. With this preload (`dask
scheduler --preload flows.clusters.roles`, `dask worker --preload ... --preload-nanny ...`; the SLURM kind adds
it), a server refuses those operations to a peer showing the workers' certificate. A peer without tokenmill's
names (Dask's own temporary certificates, another authority's) is left alone: what it may do is not told by a name.

Imports nothing of tokenmill or Prefect: the scheduler and the nannies load it too."""

from __future__ import annotations

import inspect
import logging

logger = logging.getLogger(__name__)

WORKER = "tokenmill worker"  # the common name of the workers' certificate (tokenmill.commands.certs)

# The operations that run code or submit work where they are received (scheduler, worker, nanny), or stop or
# restart the cluster: a client's (through the scheduler) and the scheduler's. A worker needs none: it registers,
# reports, fetches data from its peers and, when it ends, retires itself and lets its nanny go (`retire_workers`,
# `close_gracefully`: left to it).
NOT_FOR_WORKERS = frozenset(
    {
        # the scheduler's
        "register-client",  # a client's stream: graphs to compute
        "run_function",
        "broadcast",
        "feed",
        "proxy",
        "scatter",
        "gather",
        "update_data",
        "retry",
        "rebalance",
        "replicate",
        "set_restrictions",
        "restart",
        "restart_workers",
        "terminate",
        "dump_cluster_state_to_url",
        "register_scheduler_plugin",
        "unregister_scheduler_plugin",
        "register_worker_plugin",
        "unregister_worker_plugin",
        "register_nanny_plugin",
        "unregister_nanny_plugin",
        # a worker's
        "run",
        "run_coroutine",
        "upload_file",
        "actor_execute",
        "actor_attribute",
        "plugin-add",
        "plugin-remove",
        # a nanny's
        "instantiate",
        "kill",
        "plugin_add",
        "plugin_remove",
    }
)


class RoleRefused(PermissionError):
    """A peer asked for an operation its certificate's role may not do."""


def dask_setup(server) -> None:
    """Dask's preload hook: guard the server's handlers of NOT_FOR_WORKERS."""
    for op in NOT_FOR_WORKERS & server.handlers.keys():
        server.handlers[op] = _not_for_workers(op, server.handlers[op])


def _not_for_workers(op: str, handler):
    takes_comm = next(iter(inspect.signature(handler).parameters), None) == "comm"  # as Dask's Server calls it

    def guarded(comm, **kwargs):
        if WORKER in common_names(comm):
            logger.warning("refused %r to %s: it shows a worker's certificate, not a client's", op, comm.peer_address)
            if op == "register-client":  # a client waits for no reply to it: end the connection, so it fails now
                comm.abort()
            raise RoleRefused(f"{op}: refused, this connection shows a worker's certificate; a client needs client.pem")
        return handler(comm, **kwargs) if takes_comm else handler(**kwargs)

    return guarded


def common_names(comm) -> list[str]:
    """The common names of the peer's certificate, where the connection is TLS (else none)."""
    certificate = getattr(comm, "extra_info", {}).get("peercert") or {}
    return [value for names in certificate.get("subject", ()) for key, value in names if key == "commonName"]
