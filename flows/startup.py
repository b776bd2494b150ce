"""What makes tokenmill's processes quick to start: the modules every worker needs imported ahead of their first
task (`warm_up`), and the heap those imports build kept out of the garbage collector's passes
(`without_collector`). Imports nothing beyond the standard library: the LocalCluster's process uses it before it
imports Dask."""

from __future__ import annotations

import contextlib
import gc
import importlib
from collections.abc import Iterator, Sequence

from tokenmill.stages import PRELOADED

# The library modules of the work the flow sends the cluster (workers run them without Prefect): how a shard is
# tried, and the stages' (`tokenmill.stages`, a leaf of the standard library alone)
STAGE_MODULES = ("tokenmill.core.tries", *PRELOADED)
# What every worker imports, loaded once by the forkserver the workers fork from, instead of by each worker
# (about 3 s of CPU per worker): the stages, the encoders (optional: may be missing) and Dask's worker.
WORKER_MODULES = [*STAGE_MODULES, "gigatoken", "awkward", "tiktoken", "distributed.nanny"]


@contextlib.contextmanager
def without_collector() -> Iterator[None]:
    """Run what builds a process's lasting heap (its imports, a cluster's start) with the garbage collector off,
    then freeze it out of the collector's passes: the passes over the growing heap were a sixth of the CPU that
    the imports take, on every run's start, in each of its three interpreters (later passes skip it too, and
    workers forked after it share its pages). The few thousand objects left as cyclic garbage (about 1 MB) are
    frozen with it."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def warm_up(modules: Sequence[str] = WORKER_MODULES) -> None:
    """Import `modules` now, not when the first task needs them: in the forkserver of a cluster tokenmill starts,
    and on each worker as a run starts for workers that no such forkserver made (any other cluster)."""
    for module in modules:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
