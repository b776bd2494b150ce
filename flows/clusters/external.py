"""A Dask scheduler and workers someone else started (`dask.address`, or $TOKENMILL_DASK_ADDRESS): infra/'s
compose and Kubernetes clusters, a team's own, or the LocalCluster `tokenmill run` started ahead of the flow
(`flows.clusters.local.local_cluster_started_early`, with the credentials it was started with). TLS, where the
scheduler speaks it, comes from Dask's config (`tokenmill certs DIR` makes the certificates and prints the
settings)."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from flows.clusters import STARTED_TLS, ClusterStartError, Running

if TYPE_CHECKING:
    from tokenmill.config import DaskConfig, TokenizerConfig


def chosen(dask_config: DaskConfig) -> bool:
    return dask_config.scheduler() is not None


def threads(dask_config: DaskConfig) -> int:
    return 1  # the workers the scheduler has are the client's to count


@contextlib.contextmanager
def start(dask_config: DaskConfig, tokenizer: TokenizerConfig | None = None) -> Iterator[Running]:
    address = dask_config.scheduler()
    if host := plaintext_elsewhere(address):
        if not dask_config.allow_plaintext:
            raise ClusterStartError(
                f"the Dask scheduler at {address} would be reached over plain TCP on another host ({host}): anyone on "
                "the network between could read the shards' traffic and send the scheduler code to run as you. Use a "
                "tls:// address with certificates (`tokenmill certs DIR` makes them and prints the settings), or set "
                "dask.allow_plaintext: true on a network you trust; nothing was run"
            )
        logging.getLogger(__name__).warning(
            "the Dask scheduler at %s is reached over plain TCP, unencrypted and unauthenticated "
            "(dask.allow_plaintext)",
            address,
        )
    yield Running(address, STARTED_TLS.get(address))


def plaintext_elsewhere(address: str) -> str | None:
    """The host of a scheduler address that Dask would reach over plain TCP on another host; None for TLS (or
    another protocol) and for loopback (`localhost`, 127.0.0.0/8, ::1). A host name is taken to be another host."""
    scheme, _, rest = address.rpartition("://")
    if (scheme or "tcp") != "tcp":
        return None
    host = rest.rsplit(":", 1)[0].strip("[]") if rest.count(":") else rest
    if host == "localhost":
        return None
    try:
        return None if ipaddress.ip_address(host).is_loopback else host
    except ValueError:  # a name
        return host
