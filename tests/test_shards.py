"""How shard stages cut their work into Dask tasks: tiny shards share a task, each shard tried on its own."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tasks.shards import MAX_SHARDS_PER_TASK, TASK_BYTES, bundles, largest_first
from tokenmill.core.plan import Shard
from tokenmill.core.tries import EachShard, Failed


def test_small_shards_share_a_dask_task_and_large_ones_go_alone():
    mb = 1 << 20

    def shards(*sizes: int) -> list[Shard]:
        return [Shard(i, (), size, f"s{i}") for i, size in enumerate(sizes)]

    assert bundles(shards(*[mb] * 10)) == [range(0, 4), range(4, 8), range(8, 10)]  # 4 MB a task
    assert bundles(shards(16 * mb, mb, 16 * mb)) == [range(0, 1), range(1, 2), range(2, 3)]
    assert bundles(shards(*[100] * 300)) == [range(0, MAX_SHARDS_PER_TASK), range(MAX_SHARDS_PER_TASK, 300)]
    assert bundles([7, 8]) == [range(0, 1), range(1, 2)]  # no size known: a task each
    assert bundles([]) == [] and TASK_BYTES == 4 * mb


def test_a_stages_largest_shards_are_sent_first_and_the_smallest_last():
    """A stage ends with its last task: its largest shards go to the cluster first, tiny ones bundled as before, in
    plan order where alike; items of no known size in their order."""
    mb = 1 << 20
    shards = [Shard(i, (), size, f"s{i}") for i, size in enumerate([40 * mb, 90 * mb, mb, mb, 40 * mb, 170 * mb])]
    assert largest_first(shards) == [range(5, 6), range(1, 2), range(0, 1), range(4, 5), range(2, 4)]
    assert largest_first([7, 8, 9]) == [range(0, 1), range(1, 2), range(2, 3)]


def test_a_shard_that_keeps_failing_is_failed_alone_and_one_that_fails_once_is_retried():
    tries: dict[int, int] = {}

    def work(config, item: int, offset: int) -> int:
        tries[item] = tries.get(item, 0) + 1
        if item == 2 or (item == 3 and tries[item] == 1):
            raise ValueError(f"shard {item} cannot be read")
        return item + offset

    earlier = Failed("OSError: disk")
    failed = Failed("ValueError: shard 2 cannot be read")
    assert EachShard(work, None, (10,))([1, 2, 3, earlier]) == [11, failed, 13, earlier]
    assert tries == {1: 1, 2: 3, 3: 2}  # 1 + SHARD_RETRIES tries at most; a Failed shard is not tried again


def test_a_stage_that_sees_the_whole_chain_gets_each_shards_results_of_every_stage_before():
    """validate's check, chained after tokenize and pack, reads both results of its shard; a shard that failed
    in either is passed on untried."""
    seen = []

    def work(config, item: tuple, scale: int) -> int:
        seen.append(item)
        return sum(item) * scale

    failed = Failed("OSError: disk")
    assert EachShard(work, None, (2,), whole_chain=True)([1, 2, failed], [10, failed, 30]) == [22, failed, failed]
    assert EachShard(work, None, (2,), whole_chain=True)([5, failed]) == [10, failed]  # one stage before: tuples too
    assert seen == [(1, 10), (5,)]


def test_workers_import_no_prefect_and_the_scheduler_no_tokenmill(gpt2_run, dask_cluster):
    """The workers run library code only: a shard task that brought in `tasks/` (and so Prefect) cost each
    worker about 1.2 s of CPU at the start of every run, on the cores the shards need. The scheduler, which
    unpickles every task it is sent, gets them sealed (`tokenmill.core.tries.Sealed`): it imported tokenmill's stages,
    pydantic and the encoders for them (0.5 s of CPU as each run started)."""
    from distributed import Client

    with Client(dask_cluster) as client:
        loaded = client.run(lambda: sorted(m for m in ("prefect", "tasks", "flows.main") if m in sys.modules))
        scheduler = client.run_on_scheduler(
            lambda: sorted(m for m in sys.modules if m.split(".")[0] in ("tokenmill", "pydantic", "tokenizers"))
        )
    assert len(loaded) == 2 and all(modules == [] for modules in loaded.values()), loaded
    assert scheduler == ["tokenmill", "tokenmill.core", "tokenmill.core.tries"], scheduler


@pytest.fixture(scope="module")
def local_cluster():
    """The LocalCluster `tokenmill run` starts (its own process, its workers forked from tokenmill's forkserver), with
    two workers; yields its `Running`."""
    from flows.clusters.local import local_cluster_process
    from tokenmill.config import DaskConfig

    with local_cluster_process(DaskConfig(n_workers=2)) as started:
        yield started()


def test_the_local_clusters_own_process_imports_no_pandas(local_cluster):
    """The LocalCluster's process (its scheduler, nannies and dashboard) needs no pandas: Dask's first nanny imported
    it, with numpy and lz4, only to name them as the workers' forkserver's preload, which tokenmill's forkserver,
    already running, never read (`local_process.forkserver_preloaded`): 0.14 s of CPU as every run started."""
    from distributed import Client

    with Client(local_cluster.address, security=local_cluster.security) as client:
        assert client.run_on_scheduler(lambda: "pandas" in sys.modules) is False
        assert client.submit(lambda: 1 + 1).result() == 2  # its worker, forked from tokenmill's forkserver, works


def test_a_second_shard_goes_to_the_worker_free_first_not_behind_the_shard_just_started(local_cluster):
    """Two shards submitted while one worker runs two short sample tasks and the other is free: the first shard
    takes the free worker, and the second the busy one, free first (flows.dask_settings.SHARD_DURATIONS). Taken for
    a task of Dask's unknown 0.5 s, the first shard made its worker look the less busy, and the second queued behind
    it, the other worker idle once its samples ended (a run of two shards, one after the other, in 1 of 5 runs)."""
    from distributed import Client

    def shard(seconds: float) -> tuple[int, float, float]:  # its process, and when it started and ended
        started = time.time()
        time.sleep(seconds)
        return os.getpid(), started, time.time()

    def processing_on(keys: list, dask_scheduler=None) -> list[str | None]:  # the keys come as lists
        tasks = [dask_scheduler.tasks.get(tuple(key)) for key in keys]
        return [None if task is None or task.processing_on is None else task.processing_on.address for task in tasks]

    run = uuid.uuid4().hex[:8]  # as tasks.shards keys a stage's tasks: `<stage>-shard-<run>`
    with Client(local_cluster.address, security=local_cluster.security) as client:
        busy, free = sorted(client.nthreads())
        sampling = client.map(time.sleep, [1, 1], key=[(f"sample-shard-{run}", i) for i in range(2)], workers=[busy])
        shards = []
        for i in range(2):
            time.sleep(0.2)
            shards.append(client.submit(shard, 4, key=(f"tokenize-shard-{run}", i), pure=False))
        deadline = time.monotonic() + 10  # the submissions reach the scheduler by another connection
        while None in (placed := client.run_on_scheduler(processing_on, [future.key for future in shards])):
            assert time.monotonic() < deadline, placed
            time.sleep(0.05)
        client.gather(sampling)
        ran = client.gather(shards)
    assert placed == [free, busy]
    (first_pid, _, first_end), (second_pid, second_start, _) = ran
    assert first_pid != second_pid and second_start < first_end, ran  # side by side


def test_the_cluster_is_prepared_without_the_flow_waiting_for_it(local_cluster, tmp_path):
    """`prepare_cluster` does not wait for the workers to answer: registering the plugin is the scheduler's first
    message to each worker, which opens its connection to it (TLS), 0.1-0.4 s that every run spent waiting. Here the
    worker's event loop is held for 3 s: it returns at once all the same, and the worker gets the plugin later."""
    from distributed import Client

    from flows.cluster import QuickExit, prepare_cluster

    def hold(flag: str) -> None:  # on the worker's event loop, as `Client.run` calls a function
        Path(flag).touch()
        time.sleep(3)

    def plugins(dask_worker) -> list[str]:
        return [*dask_worker.plugins]

    flag = tmp_path / "held"
    with Client(local_cluster.address, security=local_cluster.security) as client:
        holding = threading.Thread(target=client.run, args=(hold, str(flag)))
        holding.start()
        while not flag.exists():
            time.sleep(0.01)
        started = time.perf_counter()
        prepare_cluster(client)
        returned = time.perf_counter() - started
        holding.join()
        deadline = time.monotonic() + 60
        while not all(QuickExit.name in names for names in client.run(plugins).values()):
            assert time.monotonic() < deadline, "the worker never got the plugin"
            time.sleep(0.05)
    assert returned < 1.0, f"prepare_cluster waited {returned:.2f} s for a worker whose loop was held for 3 s"


def test_one_worker_imports_matplotlib_and_another_pandera_as_the_run_starts_and_each_does_its_work(monkeypatch):
    """The report's plots are drawn on the worker that `prepare_cluster` had import matplotlib (0.3 s of CPU that
    the end of every run waited for, when the worker asked to draw imported it then), and the stats table is checked
    on the other, which it had import pandera (the flow's process must not: `schema_library`); no worker imports
    what the other's work needs. The work prefers its worker (Dask may still move it to an idle one, which then
    imports what it needs, as before: here its work stealing is off, so that the preference alone decides)."""
    from distributed import Client

    from flows.cluster import checking_worker, drawing_worker, prepare_cluster, workers_now
    from flows.clusters.local import local_cluster_process
    from tasks.shards import on_a_worker
    from tokenmill.config import DaskConfig

    def loaded() -> tuple[bool, bool]:
        return "matplotlib.pyplot" in sys.modules, "pandera.backends.pandas.container" in sys.modules

    monkeypatch.setenv("DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING", "False")  # the cluster's process reads it
    with local_cluster_process(DaskConfig(n_workers=2)) as started:
        running = started()
        with Client(running.address, security=running.security, set_as_default=True) as client:
            prepare_cluster(client)
            workers = workers_now(client)
            drawer, checker = drawing_worker(workers), checking_worker(workers)
            assert drawer != checker
            deadline = time.monotonic() + 60
            while client.run(loaded, workers=[drawer, checker]) != {drawer: (True, False), checker: (False, True)}:
                assert time.monotonic() < deadline, "the workers never imported matplotlib and pandera"
                time.sleep(0.05)
            pids = client.run(os.getpid)
            assert {on_a_worker(os.getpid, preferred=drawer) for _ in range(4)} == {pids[drawer]}
            assert {on_a_worker(os.getpid, preferred=checker) for _ in range(4)} == {pids[checker]}


def test_no_task_hashes_its_inputs_or_persists_its_result():
    """Prefect's default cache policy hashed every task's inputs on every call (8 s for a 100,000-shard plan);
    reuse is the commit markers' business. Every task of tasks/ is uncached."""
    import importlib
    import pkgutil

    from prefect import Task
    from prefect.cache_policies import NO_CACHE

    import tasks

    found = {
        obj.name: obj
        for info in pkgutil.iter_modules(tasks.__path__)
        for obj in vars(importlib.import_module(f"tasks.{info.name}")).values()
        if isinstance(obj, Task)
    }
    assert {"partition", "choose_encoder", "tokenize", "validate", "publish"} <= set(found)
    for name, task in found.items():
        assert task.cache_policy is NO_CACHE and task.persist_result is False, name


def test_shards_that_fail_alike_are_one_line_of_the_error():
    """A cluster lost mid-run fails every shard in flight the same way: one line per cause, not one per shard."""
    from tasks.shards import ShardsFailed

    failures = {i: "OSError('Timed out')" for i in range(1000)} | {
        1002: "ValueError('bad')",
        1004: "OSError('Timed out')",
    }
    assert str(ShardsFailed("tokenize", failures, 3000)).splitlines() == [
        "tokenize: 1002 of 3000 shards failed (a rerun reuses every committed shard and redoes these)",
        "  shards 00000-00999, 01004: OSError('Timed out')",
        "  shard 01002: ValueError('bad')",
    ]


def test_a_group_waiting_on_the_cluster_ends_when_the_flows_client_closes(dask_cluster):
    """Ctrl-C closes the flow's Dask client under the group threads waiting for their shards, and Prefect then waits
    for those threads. Dask's own waits raised UnboundLocalError there (dask/distributed#8514) or, caught as its
    event loop stopped, never returned: the run hung at exit (seen once in the suite's Ctrl-C test). The group's
    waits end within seconds: a result awaited raises an error that says what happened, and the wait for the next
    completed shards gives the cancelled ones (the group then fails naming them) or, where the client stopped
    before they reached it, the same error."""
    import threading
    import time

    from distributed import Client, as_completed

    from tasks.shards import ClientClosed, completed_batches, gather

    def closed_under(call):
        """What `call` returned or raised once its client closed under it, within 5 s."""
        outcome = []

        def wait() -> None:
            try:
                outcome.append(call())
            except BaseException as e:  # noqa: BLE001 (what it raised is what is tested)
                outcome.append(e)

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        time.sleep(1)  # it is waiting
        client.close()
        thread.join(5)
        assert outcome, "still waiting 5 s after the client closed"
        return outcome[0]

    client = Client(dask_cluster)  # the default client, as the flow's is
    running = client.submit(time.sleep, 60, pure=False)
    error = closed_under(lambda: gather(client, running))
    assert isinstance(error, ClientClosed) and "a rerun reuses them" in str(error), repr(error)

    client = Client(dask_cluster)
    chains = as_completed([client.submit(time.sleep, 60, pure=False)])
    batches = closed_under(lambda: list(completed_batches(chains, client)))
    assert isinstance(batches, ClientClosed) or [[f.status for f in b] for b in batches] == [["cancelled"]], batches


def test_the_workers_are_asked_for_and_a_closed_client_gets_none_at_once(dask_cluster):
    """A run's callback that starts work on every worker as its client closes returns, rather than wait on Dask's
    event loop without end (a bad-input run hung there until killed)."""
    import time

    from distributed import Client

    from flows.cluster import workers_now

    client = Client(dask_cluster, set_as_default=False)
    assert len(workers_now(client)) == 2
    client.close()
    started = time.monotonic()
    assert workers_now(client) == []
    assert time.monotonic() - started < 5


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no thread of its own on one core")
def test_numpy_starts_no_blas_threads_in_tokenmills_processes():
    """numpy's OpenBLAS starts a thread per core as it is imported, which spins for 0.1 s of CPU: in each process of
    a run (the command's, the LocalCluster's, the forkserver's, which they inherit the setting from) it is one
    thread, none spinning. Without tokenmill's setting (`flows/__init__.py`) the same import starts more."""
    count = "import os, sys; {} import numpy; print(len(os.listdir('/proc/self/task')))"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}

    def threads(before: str) -> int:
        run = subprocess.run([sys.executable, "-c", count.format(before)], env=env, capture_output=True, text=True)
        return int(run.stdout)

    assert threads("import flows;") == 1
    assert threads("") > 1
