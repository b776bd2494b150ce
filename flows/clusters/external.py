"""A Dask scheduler and workers someone else started (`dask.address`, or $TOKENMILL_DASK_ADDRESS): infra/'s
compose and Kubernetes clusters, or a team's own. TLS, where the
scheduler speaks it, comes from Dask's config (`tokenmill certs DIR` makes the certificates and prints the
settings)."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from flows.clusters import ClusterStartError, Running

if TYPE_CHECKING:
    from tokenmill.config import DaskConfig, TokenizerConfig


def chosen(dask_config: DaskConfig) -> bool:
    return dask_config.scheduler() is not None


def threads(dask_config: DaskConfig) -> int:
    return 1  # the workers the scheduler has are the client's to count


PLAINTEXT_ENV = "TOKENMILL_DASK_ALLOW_PLAINTEXT"  # the environment's dask.allow_plaintext (a deployment's, a test's)


@contextlib.contextmanager
def start(dask_config: DaskConfig, tokenizer: TokenizerConfig | None = None) -> Iterator[Running]:
    address = dask_config.scheduler()
    if host := plaintext_host(address):
        if not (dask_config.allow_plaintext or os.environ.get(PLAINTEXT_ENV, "") not in ("", "0", "false")):
            where = "on this host's loopback, which every user of the host reaches" if loopback(host) else (
                f"on another host ({host}), which anyone on the network between reaches"
            )  # fmt: skip
            raise ClusterStartError(
                f"the Dask scheduler at {address} would be reached over plain TCP {where}: they could read the "
                "shards' traffic and send the scheduler code to run as you. Use a tls:// address with certificates "
                "(`tokenmill certs DIR` makes them and prints the settings), a LocalCluster (dask.address: null), or "
                f"set dask.allow_plaintext: true (or {PLAINTEXT_ENV}=1) where no one else can reach it; nothing was run"
            )
        logging.getLogger(__name__).warning(
            "the Dask scheduler at %s is reached over plain TCP, unencrypted and unauthenticated "
            "(dask.allow_plaintext)",
            address,
        )
    yield Running(address)


def plaintext_host(address: str) -> str | None:
    """The host of a scheduler address that Dask would reach over plain TCP; None for TLS (or another protocol)."""
    scheme, _, rest = address.rpartition("://")
    if (scheme or "tcp") != "tcp":
        return None
    return rest.rsplit(":", 1)[0].strip("[]") if rest.count(":") else rest


def loopback(host: str) -> bool:
    """`localhost`, 127.0.0.0/8 or ::1 (a host name is taken to be another host)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
