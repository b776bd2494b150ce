"""A Dask scheduler and workers someone else started (`dask.address`, or $TOKENMILL_DASK_ADDRESS): infra/'s
compose and Kubernetes clusters, a team's own, or the LocalCluster `tokenmill run` started ahead of the flow
(`flows.clusters.local.local_cluster_started_early`). TLS, where the scheduler speaks it, comes from Dask's config
(`tokenmill certs DIR` makes the certificates and prints the settings)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from flows.clusters import Running

if TYPE_CHECKING:
    from tokenmill.config import DaskConfig, TokenizerConfig


def chosen(dask_config: DaskConfig) -> bool:
    return dask_config.scheduler() is not None


def threads(dask_config: DaskConfig) -> int:
    return 1  # the workers the scheduler has are the client's to count


@contextlib.contextmanager
def start(dask_config: DaskConfig, tokenizer: TokenizerConfig | None = None) -> Iterator[Running]:
    yield Running(dask_config.scheduler())
