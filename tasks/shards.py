"""How a shard stage runs: Prefect task runs over groups of shards, each group's shards plain Dask tasks.

A Prefect task run costs about 50 ms of CPU (the flow's task engine and the server's events, logs and state writes;
docs/performance.md), a Dask task a few ms. So a shard stage (`StageRun`) is at most `dask.groups_per_stage`
Prefect task runs (by default one per cluster thread, at most MAX_GROUPS), each over a group of consecutive shards,
run in the flow's thread pool while the flow goes on, with the stage's progress artifact. A group (`run_on_dask`)
sends its shards to the cluster as Dask tasks of the library's shard functions, keyed `(<stage>-shard-<run>, shard
id)` (the Dask dashboard shows `<stage>-shard`), small shards bundled into one task (`bundles`), a bounded window at
a time; consecutive stages chain per shard on the cluster (a shard's pack starts when its tokenize ends, and the
result goes from worker to worker). Each shard is tried on its own, with retries, on its worker
(`tokenmill.core.tries`, which the workers and the scheduler import: it stays free of Prefect and of this module), and
each Dask task is retried if its worker dies. The workers run library code only, so shard work never talks to the
Prefect server. A group fails naming every shard of it that failed and the stage it failed in; the others are
committed (their markers), so Retry redoes only the failed ones.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from distributed import as_completed, default_client
from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.utilities.annotations import quote

from tasks import UNCACHED
from tokenmill.config import TokenmillConfig
from tokenmill.core.client_waits import ALIVE_CHECK_S, Unanswered, client_runs, loop_runs, on_client_loop
from tokenmill.core.plan import mix_sources
from tokenmill.core.tries import SHARD_RETRIES, EachShard, Failed, Parcel, Raised, Sealed, caught
from tokenmill.io.readers import largest_records
from tokenmill.stages import STAGES

# Task runs per shard stage by default: one per cluster thread, at most this many. A task run costs about 50 ms
# of CPU in the flow and the server; one per shard made a 10 s run of 16 shards on 2 cores 0.4 s slower.
MAX_GROUPS = 32


PROGRESS_EVERY_S = 1.0  # the least time between two updates of a stage's progress artifact


WINDOW_PER_THREAD = 4  # a group keeps at most this many Dask tasks per cluster thread on the cluster at once


# Shards smaller than this share a Dask task, consecutive ones up to this many bytes (and MAX_SHARDS_PER_TASK),
# so that a Dask task's 2-3 ms of scheduler and client time stays small beside its work; shards of
# `shard_size: auto` (16 MB or more) have a task each.
TASK_BYTES, MAX_SHARDS_PER_TASK = 4 << 20, 256


@dataclass(frozen=True)
class Stage:
    """One step of a shard's work: `work(context, item, *args)`, where `context` is what the stage uses of the run
    (its part of the config, as `tokenmill.stages.tokenize.Tokenizing`, or the config), and the item is the shard (first
    stage) or the previous stage's result for it; with `whole_chain`, the tuple of every earlier stage's result."""

    name: str
    work: Callable
    context: object
    args: tuple = ()
    whole_chain: bool = False

    @classmethod
    def of(cls, name: str, *made_from, args: tuple = ()) -> Stage:
        """The shard stage `name` as its record declares it (`tokenmill.stages`), its context made from `made_from`
        (the config, and what else its context's `of` takes)."""
        record = STAGES[name]
        return cls(name, record.function(), record.context_of(*made_from), args, record.whole_chain)


def stage_groups(config: TokenmillConfig, cluster_threads: int) -> int:
    """The most task runs a shard stage has: `dask.groups_per_stage`, else one per cluster thread (at most
    MAX_GROUPS)."""
    return config.dask.groups_per_stage or min(MAX_GROUPS, cluster_threads)


def in_groups(items: list, groups_per_stage: int) -> list[quote]:
    """`items` cut into at most `groups_per_stage` consecutive groups, each wrapped so that Prefect does not walk
    its contents."""
    size = max(1, math.ceil(len(items) / groups_per_stage))
    return [quote(items[start : start + size]) for start in range(0, len(items), size)]


class StageRun:
    """A shard stage's task submitted over every group of items (at most `groups`); its groups run in the flow's
    thread pool while the flow does other work, until `wait()` or `results()` waits for them."""

    def __init__(self, stage_task, config: TokenmillConfig, items: list, *args, groups: int):
        self.stage_task, self.items = stage_task, items
        self.groups = in_groups(items, groups)
        self.futures = [stage_task.submit(config, group, *args) for group in self.groups]

    def wait(self) -> list:
        """Each group's result, in order, once every group has ended; or ShardsFailed naming every shard that
        failed (a flow must not end Completed with failed shards, which Prefect allows when their states are not
        returned)."""
        return self._group_results

    @functools.cached_property
    def _group_results(self) -> list:
        failures: dict[str, dict[int, str]] = {}
        progress = StageProgress(self.stage_task.name, self.items)
        for future, group in zip(self.futures, self.groups, strict=True):
            future.wait()
            progress.done(group.unwrap())
            if future.state.is_completed():
                continue
            error = future.state.result(raise_on_failure=False)
            if isinstance(error, GroupFailed):
                for stage, failed in error.failures.items():
                    failures.setdefault(stage, {}).update(failed)
            else:  # the task itself failed, outside its shards' work
                failures.setdefault(self.stage_task.name, {}).update({shard_id(i): repr(error) for i in group.unwrap()})
        if failures:
            check_scheduler()
        for stage, failed in failures.items():
            if failed:
                raise ShardsFailed(stage, failed, len(self.items))
        return [future.result() for future in self.futures]

    def results(self) -> list:
        """For a stage whose groups return a result per item: every item's result, in order."""
        return [result for group in self.wait() for result in group]


class StageProgress:
    """A shard stage's progress artifact: shards done, in percent (in a mixture its description names the
    sources); updated at most once a second (each update is an API call), and when the stage is done."""

    def __init__(self, stage: str, items: list):
        self.total, self.finished = len(items), 0
        sources = mix_sources(items)
        of_sources = f" ({', '.join(sources)})" if sources else ""
        self.artifact = create_progress_artifact(0.0, description=f"{stage}: shards done, in percent{of_sources}")
        self.reported = time.monotonic()

    def done(self, items: list) -> None:
        self.finished += len(items)
        if self.finished == self.total or time.monotonic() - self.reported >= PROGRESS_EVERY_S:
            update_progress_artifact(self.artifact, 100 * self.finished / self.total)
            self.reported = time.monotonic()


def map_shards(stage_task, config: TokenmillConfig, items: list, *args, groups: int) -> list:
    """A shard stage whose groups return a result per item, run and waited for: every item's result, in order."""
    return StageRun(stage_task, config, items, *args, groups=groups).results()


def shard_id(item) -> int:
    """The shard an item stands for: a shard of the plan (or an item of validate's about one), or a bare shard id."""
    return item if isinstance(item, int) else item.shard_id


def group_label(ids: list[int]) -> str:
    return f"shard-{ids[0]:05d}" if len(ids) == 1 else f"shards {ids[0]:05d}-{ids[-1]:05d}"


def _run_name(parameters: dict) -> str:
    """`<task name>[shard-00007]` or `<task name>[shards 00000-00099]`; in a mixture the group's sources follow,
    `tokenize[shards 00040-00059: wiki, code]`."""
    from prefect.runtime import task_run

    items = parameters["items"]
    items = items.unwrap() if isinstance(items, quote) else items
    label = group_label([shard_id(i) for i in items])
    if sources := mix_sources(items):
        label += f": {', '.join(sources)}"
    return f"{task_run.task_name}[{label}]"


# The options of every shard stage's task: uncached (its result lives in the flow's memory only, the commit markers
# are the durable record), and its runs are named by their shards.
GROUP_TASK = {"task_run_name": _run_name, **UNCACHED}


def run_on_dask(items: list, stages: list[Stage], keep: Callable[[tuple], object] = tuple) -> list:
    """Every item through `stages` on the Dask cluster (each stage's context and arguments with each task);
    for each item, in item order, what `keep` makes of its results (a tuple, one per stage: all of them by
    default), or GroupFailed. A group holds what it keeps of every item until it ends: where the results are
    a few KB a shard, `keep` what is needed. Items go in bundles (see `bundles`), a Dask task per bundle and
    stage, submitted and collected in batches (one message to the scheduler per batch and stage), at most a
    window at a time."""
    client = default_client()
    started = time.perf_counter()
    run = uuid.uuid4().hex[:8]  # keys unique per submission: a shared cluster may hold an earlier run's
    # The stages' contexts and arguments (a few KB) go with each task rather than scattered once: scattered data
    # lives on one worker and is lost with it, failing every task that needs it (fault campaign, worker_kill).
    window = max(8, WINDOW_PER_THREAD * sum(client.nthreads().values()))
    ids = [shard_id(i) for i in items]
    todo = largest_first(items)
    results: list = [None] * len(items)
    failures: dict[str, dict[int, str]] = {stage.name: {} for stage in stages}
    chains, running, submitted, reused = as_completed(), {}, 0, 0
    sealed = [Sealed(each_shard(stage)) for stage in stages]
    retried: set[range] = set()  # bundles tried again with smaller batches (`with_smaller_batches`)

    def submit(count: int) -> None:
        nonlocal submitted
        batch = todo[submitted : submitted + count]
        submitted += len(batch)
        if batch:
            submit_bundles(batch, stages, sealed, run)

    def submit_bundles(batch: list[range], stages: list[Stage], sealed: list[Sealed], run: str) -> None:
        arguments, per_stage = [Parcel(list(items[bundle.start : bundle.stop])) for bundle in batch], []
        for stage, work in zip(stages, sealed, strict=True):
            arguments = client.map(
                work, *(per_stage if stage.whole_chain else [arguments]),
                key=[(f"{stage.name}-shard-{run}", ids[bundle[0]]) for bundle in batch],
                retries=SHARD_RETRIES, pure=False,
            )  # fmt: skip
            per_stage.append(arguments)
        for bundle, *futures in zip(batch, *per_stage, strict=True):
            running[futures[-1].key] = (bundle, futures)
        chains.update(per_stage[-1])

    def record(bundle: range, per_stage: list[list]) -> None:
        nonlocal reused
        for k, index in enumerate(bundle):
            values = tuple(stage_results[k] for stage_results in per_stage)
            failed = next((i for i, v in enumerate(values) if isinstance(v, Failed)), None)
            if failed is None:
                reused += getattr(values[0], "reused", False)  # a result that says (`stats.Committed`)
                results[index] = keep(values)
            else:
                failures[stages[failed].name][ids[index]] = values[failed].error

    submit(window)
    for done in completed_batches(chains, client):
        finished = []
        for last in done:
            bundle, futures = running.pop(last.key)
            failed = next((i for i, f in enumerate(futures) if f.status != "finished"), None)
            if failed is None:
                finished.append((bundle, futures))
            elif (smaller := with_smaller_batches(stages, failed, futures[failed])) and bundle not in retried:
                # Its workers died, most likely for memory, in a stage that can hold less at once: once more so.
                retried.add(bundle)
                get_run_logger().warning(
                    "%s %s: every worker that ran it died (most likely for memory); trying it again with %s",
                    stages[failed].name, group_label([ids[index] for index in bundle]), smaller[1],
                )  # fmt: skip
                submit_bundles([bundle], smaller[0], [Sealed(each_shard(stage)) for stage in smaller[0]], run + "-less")
            else:  # the task itself failed: its worker died, every try
                error = _error(futures[failed], stages[failed], [items[index] for index in bundle])
                for index in bundle:
                    failures[stages[failed].name][ids[index]] = error
        values = iter(gather(client, [f for _, futures in finished for f in futures]))  # one round trip
        for bundle, futures in finished:
            record(bundle, [next(values) for _ in futures])
        del finished, done
        submit(window - len(running))
    if any(failures.values()):
        raise GroupFailed(failures)
    get_run_logger().info(
        "%s %s: %d shards (%d reused) in %d Dask tasks per stage, %.2f s", "+".join(s.name for s in stages),
        group_label(ids), len(ids), reused, len(todo), time.perf_counter() - started,
    )  # fmt: skip
    return results


def each_shard(stage: Stage) -> EachShard:
    return EachShard(stage.work, stage.context, stage.args, stage.whole_chain)


RETRY_BATCH_BYTES = 1 << 20  # the most text a stage tried again for memory holds at once


def with_smaller_batches(stages: list[Stage], failed: int, future) -> tuple[list[Stage], str] | None:
    """`stages` with the `failed` one's batches smaller (its context's `batch_bytes`, tokenizer.batch_bytes: an
    eighth, at most RETRY_BATCH_BYTES), and what changed, where its future's workers all died (Dask's KilledWorker,
    most often memory) and it holds a batch at once; else None."""
    if future.status != "error" or type(future.exception()).__name__ != "KilledWorker":
        return None
    stage = stages[failed]
    held = getattr(stage.context, "batch_bytes", 0)
    less = max(MIN_BATCH_BYTES, min(RETRY_BATCH_BYTES, held // 8))
    if less >= held:
        return None
    smaller = dataclasses.replace(stage, context=dataclasses.replace(stage.context, batch_bytes=less))
    return [smaller if s is stage else s for s in stages], f"{stage.name}'s batches of {less:,} bytes"


MIN_BATCH_BYTES = 64 << 10


def bundles(items: list) -> list[range]:
    """Consecutive items, a Dask task's worth each: up to TASK_BYTES of shards (an item's `bytes`; an item
    without it goes alone) and MAX_SHARDS_PER_TASK."""
    found, start, total = [], 0, 0
    for index, item in enumerate(items):
        size = getattr(item, "bytes", TASK_BYTES)
        if index > start and (total + size > TASK_BYTES or index - start == MAX_SHARDS_PER_TASK):
            found.append(range(start, index))
            start, total = index, 0
        total += size
    return found + [range(start, len(items))] if items else found


def largest_first(items: list) -> list[range]:
    """`bundles(items)`, the most bytes first (in their order where alike): a stage ends with its last task, and its
    shards differ in size (small files grouped into half a shard to two, a compressed file whole, a file's last
    piece), so the smallest are left to fill the last gaps. Dask runs the tasks of one submission in its order."""
    return sorted(bundles(items), key=lambda bundle: -sum(getattr(items[i], "bytes", 0) for i in bundle))


def on_a_worker(
    work: Callable,
    *args,
    priority: int = 0,
    preferred: str | None = None,
    bounded_by: str = "Its memory is bounded by its settings",
):
    """`work(*args)` (a library call) on a worker of the cluster, waited for: for work that uses what every worker
    has loaded (the encoders), which the flow's process would load for it (about 0.5 s of its CPU). `priority`
    orders it among the shard tasks waiting for a worker (theirs is 0). `preferred`: the address of the worker to
    run it on (it has loaded what the work needs); Dask may still give it to another, an idle one or any if that
    one has gone. What it raises is raised here, not logged by the worker with its traceback. `bounded_by`: the
    settings that bound its memory, for the message of a call that ran out of it."""
    client = default_client()
    where = {"workers": [preferred], "allow_other_workers": True} if preferred else {}
    try:
        result = gather(client, client.submit(Sealed(caught, work, *args), pure=False, priority=priority, **where))
    except Exception as e:
        if type(e).__name__ != "KilledWorker":
            raise
        raise OutOfMemory(
            f"{work.__name__} ran out of memory: every Dask worker that ran it died (Dask's KilledWorker), most often "
            f"for passing dask.memory_limit. {bounded_by}; raise dask.memory_limit or lower those, then rerun"
        ) from None
    if isinstance(result, Raised):
        raise result.error
    return result


class OutOfMemory(RuntimeError):
    """A call on a worker killed every worker that ran it, most likely for memory."""


class ShardsFailed(RuntimeError):
    """Some shards did not complete; their committed siblings are reused when the run is retried."""

    def __init__(self, stage: str, failures: dict[int, str], total: int):
        self.stage, self.failures, self.total = stage, failures, total
        by_error: dict[str, list[int]] = {}
        for sid, error in sorted(failures.items()):
            by_error.setdefault(error, []).append(sid)
        lines = [f"  {shard_list(sids)}: {error}" for error, sids in by_error.items()]
        super().__init__(
            f"{stage}: {len(failures)} of {total} shards failed (a rerun reuses every committed shard and redoes "
            "these)\n" + "\n".join(lines)
        )


def shard_list(ids: list[int], most: int = 8) -> str:
    """Sorted shard ids as a person reads them: "shard 00004", "shards 00000-00007, 00012", at most `most` runs
    of consecutive ids shown (a cluster lost mid-run fails every shard the same way: one line, not thousands)."""
    runs: list[list[int]] = []
    for sid in ids:
        if runs and sid == runs[-1][1] + 1:
            runs[-1][1] = sid
        else:
            runs.append([sid, sid])
    shown = ", ".join(f"{a:05d}" if a == b else f"{a:05d}-{b:05d}" for a, b in runs[:most])
    more = f", ... ({len(ids)} in all)" if len(runs) > most else ""
    return f"shard {shown}" if len(ids) == 1 else f"shards {shown}{more}"


class GroupFailed(RuntimeError):
    """A group's failed shards, per stage (a shard counts in the first stage it failed in)."""

    def __init__(self, failures: dict[str, dict[int, str]]):
        self.failures = failures
        super().__init__("\n".join(str(ShardsFailed(stage, f, len(f))) for stage, f in failures.items() if f))


def _error(future, stage: Stage, shards: list) -> str:
    """What a shard's failed Dask task says to a person: for a worker killed every time, the memory it most likely
    ran out of, its largest documents and what bounds them."""
    if future.status == "error":
        error = future.exception()
        if type(error).__name__ == "KilledWorker":  # Dask's own words name neither the cause nor the documents
            return (
                f"{stage.name} ran out of memory: every Dask worker that ran it died (Dask's KilledWorker), most often "
                f"for passing dask.memory_limit{largest_documents(stage, shards)}. What bounds its memory: "
                f"{MEMORY_BOUNDS.get(stage.name, MEMORY_BOUNDS[''])}. Raise dask.memory_limit or lower those; a rerun "
                "redoes only these shards"
            )
        return f"{type(error).__name__}: {error}"
    if future.status == "cancelled":  # seen when workers were restarted for memory (campaign, oom kind)
        return (
            "its Dask task was cancelled: the workers running it died (most often for memory: raise "
            "dask.memory_limit or make the shards smaller), or the connection to the scheduler was lost; then rerun"
        )
    return f"its Dask task ended {future.status}"


# What bounds a shard stage's memory, for the message of a shard that ran out of it.
MEMORY_BOUNDS = {
    "": "partition.shard_size",
    "tokenize": "tokenizer.batch_bytes (about 8 bytes a byte of a batch; it was tried again with batches of 1 MB), "
    "and about 2 bytes a byte of its longest document (its text, parsed)",
    "reference": "tokenizer.check_bytes and tokenizer.reference_piece_bytes (hf holds ~200 bytes a byte it encodes)",
    "sample": "tokenizer.reference_piece_bytes (a document's excerpt) and partition.shard_size",
}
KILLED_SHARDS_READ = 3  # a group's shards killed for memory whose largest documents the message names


def largest_documents(stage: Stage, shards: list) -> str:
    """ "; its largest documents: FILE line N (SIZE), ..." for shards of the plan (with pieces) that the stage reads
    (its context says how), else ""."""
    reading = getattr(stage.context, "reading", None)
    plan_shards = [getattr(item, "shard", item) for item in shards[:KILLED_SHARDS_READ]]  # a reference item's shard
    found = [
        record
        for shard in plan_shards
        if reading is not None and hasattr(shard, "pieces")
        for record in largest_records(shard.pieces, reading[shard.mix_source])
    ]
    found = sorted(found, key=lambda r: -r[2])[:3]
    return (
        "; its largest documents: " + ", ".join(f"{f} line {n} ({b / 1e6:.1f} MB)" for f, n, b in found)
        if found
        else ""
    )


class SchedulerLost(ConnectionError):
    """The flow's client lost its scheduler mid-run, for good."""


def check_scheduler() -> None:
    """SchedulerLost where this process's client has lost its scheduler: reconnecting, or closed after it gave up
    (Dask tries for distributed.comm.timeouts.connect, 30 s). The shards in flight then all fail in Dask's words,
    and the cause is the network or the scheduler, not the shards."""
    try:
        lost = default_client().status != "running"
    except ValueError:  # no client left: the closed one is no longer the default
        lost = True
    if lost:
        raise SchedulerLost(
            "lost the Dask scheduler mid-run: no answer from it for 30 s (its host down or cut off, or the scheduler "
            "ended); the shards committed so far are kept: once it is reachable, run the same command again and "
            "it reuses every one of them"
        )


# The flow's waits on the cluster, in its group threads. Dask's own blocking calls wait for its event loop without
# end, and when the flow closes its client (Ctrl-C, a failure elsewhere) a call caught as the loop stops never
# returns (a run hung at exit: Prefect joins the group threads) or raises UnboundLocalError
# (dask/distributed#8514). These wait on the loop themselves and give up once the client no longer runs.


class ClientClosed(RuntimeError):
    """The flow's Dask client closed while a group waited on the cluster: the run is ending."""

    def __init__(self):
        super().__init__(
            "the run's Dask client closed while this group waited for its shards (the run was interrupted or failed "
            "elsewhere); the shards committed so far are kept, and a rerun reuses them"
        )


def gather(client, futures):
    """`client.gather(futures)`, or ClientClosed once the client is closed under it."""
    try:
        return on_client_loop(client, client.gather(futures, asynchronous=True))
    except Unanswered:
        raise ClientClosed() from None
    except BaseException:  # the futures cancelled as the client closes, or a task's own error
        if not client_runs(client):
            raise ClientClosed() from None
        raise


def completed_batches(chains: as_completed, client) -> Iterator[list]:
    """`chains.batches()`, or ClientClosed once the client no longer runs."""
    while not chains.is_empty():
        if chains.has_ready():
            yield chains.next_batch(block=False)
            continue
        with chains.thread_condition:  # notified as each future completes
            chains.thread_condition.wait(timeout=ALIVE_CHECK_S)
        if not chains.has_ready() and not loop_runs(client):
            raise ClientClosed()
