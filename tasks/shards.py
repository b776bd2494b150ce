"""Shard stages as Prefect tasks over groups of shards, each group's shards run as plain Dask futures.

A Prefect task run costs about 0.2 s of orchestration on 2 cores (flow, worker and server together; README
"Orchestration"), a plain Dask future about 2 ms. So a shard stage is one Prefect task run per *group* of
consecutive shards (one per shard while a run has at most `MAX_GROUPS` shards), and the group's shards go to
the cluster as Dask futures of the library's shard function, named `<stage>-shard-NNNNN` (what the Dask
dashboard shows), each with its own retries. The group tasks run in the flow's process; the workers run
library code only, and shard work never talks to the Prefect server. A group fails naming every shard of it
that failed; the others are committed (their markers), so Retry of the flow run redoes only the failed ones.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable

from distributed import default_client, wait
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

MAX_GROUPS = 250  # task runs per stage: a flow run stays far below the ~2,000 where Prefect's server struggles
SHARD_RETRIES = 2  # per shard, by Dask, on the worker that runs it


class ShardsFailed(RuntimeError):
    """Some shards did not complete; their committed siblings are reused when the run is retried."""

    def __init__(self, stage: str, failures: dict[int, str], total: int):
        self.stage, self.failures, self.total = stage, failures, total
        lines = [f"  shard {sid:05d}: {error}" for sid, error in sorted(failures.items())]
        super().__init__(f"{stage}: {len(failures)} of {total} shards failed\n" + "\n".join(lines))


def group_size(n_shards: int) -> int:
    return max(1, math.ceil(n_shards / MAX_GROUPS))


def in_groups(items: list, size: int) -> list:
    """`items` cut into consecutive groups of `size`, each wrapped so Prefect does not walk its contents."""
    return [quote(items[start : start + size]) for start in range(0, len(items), size)]


def shard_id(item) -> int:
    """The shard an item of a stage stands for: a shard of the plan, a shard's result, or a bare shard id."""
    return item["shard_id"] if isinstance(item, dict) else int(item)


def group_label(ids: list[int]) -> str:
    return f"shard-{ids[0]:05d}" if len(ids) == 1 else f"shards {ids[0]:05d}-{ids[-1]:05d}"


def _run_name(parameters: dict) -> str:
    from prefect.runtime import task_run

    items = parameters["items"]
    items = items.unwrap() if isinstance(items, quote) else items
    return f"{task_run.task_name}[{group_label([shard_id(i) for i in items])}]"


def run_on_dask(stage: str, work: Callable, items: list, *shared) -> list:
    """`work(config, item, *rest)` for every item on the Dask cluster (`shared` = config, *rest is sent to the
    workers once); the results in item order, or ShardsFailed naming each shard that failed."""
    client = default_client()
    started = time.perf_counter()
    ids = [shard_id(i) for i in items]
    run = uuid.uuid4().hex[:8]  # keys unique per submission: a shared cluster may hold an earlier run's
    config, *rest = [[future] * len(items) for future in client.scatter(list(shared), hash=False)]
    futures = client.map(
        work, config, items, *rest,
        key=[f"{stage}-shard-{sid:05d}-{run}" for sid in ids], retries=SHARD_RETRIES, pure=False,
    )  # fmt: skip
    wait(futures)
    failures = {sid: _error(f) for sid, f in zip(ids, futures, strict=True) if f.status != "finished"}
    if failures:
        client.cancel(futures)
        raise ShardsFailed(stage, failures, len(items))
    results = client.gather(futures)
    reused = sum(bool(r.get("reused")) for r in results if isinstance(r, dict))
    get_run_logger().info(
        "%s %s: %d shards (%d reused) in %.2f s", stage, group_label(ids), len(ids), reused,
        time.perf_counter() - started,
    )  # fmt: skip
    return results


def _error(future) -> str:
    if future.status == "error":
        error = future.exception()
        return f"{type(error).__name__}: {error}"
    return f"Dask future {future.status}"


def shard_task(stage: str, work: Callable):
    """The Prefect task of a shard stage: `work` over a group of items on Dask. Its result lives in the flow's
    memory only (the commit markers are the durable record), and it is never cached by Prefect."""

    @task(name=stage, task_run_name=_run_name, cache_policy=NO_CACHE, persist_result=False)
    def run_group(config, items: list, *rest) -> list:
        return run_on_dask(stage, work, items, config, *rest)

    return run_group
