"""Where the flow runs: the Dask task runner built from `dask:` config (the cluster's settings are in
`flows.cluster`)."""

from __future__ import annotations

from prefect_dask import DaskTaskRunner

from flows.cluster import adapt_kwargs, local_cluster_kwargs
from tokenmill.config import DaskConfig


def task_runner_for(dask_config: DaskConfig) -> DaskTaskRunner:
    """A DaskTaskRunner for an existing scheduler, or a LocalCluster of worker processes on 127.0.0.1."""
    if address := dask_config.scheduler():
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(cluster_kwargs=local_cluster_kwargs(dask_config), adapt_kwargs=adapt_kwargs(dask_config))
