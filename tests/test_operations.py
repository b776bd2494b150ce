"""Operations: a served deployment triggered with parameters, Retry of a failed run reusing finished shards,
targeted reruns, an external Dask cluster, cron schedules, and a Prefect server on PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flows.server import free_port

from .conftest import (
    GATED_RUN,
    REPO,
    TOKENMILL,
    a_project_of_its_own,
    api_post,
    dataset_files,
    gated_news,
    served_process,
    stop,
)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def deployment_named(client, name: str):
    """The deployment, once it exists (other tests' deployments may already be there)."""
    from prefect.exceptions import ObjectNotFound

    try:
        return client.read_deployment_by_name(name)
    except ObjectNotFound:
        return None


def final_state(client, flow_run_id, timeout=240):
    def done():
        state = client.read_flow_run(flow_run_id).state
        return state if state is not None and state.is_final() else None

    return wait_for(done, timeout, f"flow run {flow_run_id} to finish")


def press_retry(client, flow_run_id):
    """What the UI's Retry button (and `prefect flow-run retry`) sends; the run's final state after it."""
    from prefect.client.schemas.objects import StateType
    from prefect.states import State

    retry = State(type=StateType.SCHEDULED, name="AwaitingRetry", message="Retry from the UI")
    client.set_flow_run_state(flow_run_id, retry, force=True)
    return final_state(client, flow_run_id)


def logged(client, flow_run_id, text: str) -> bool:
    """Whether the flow run logged `text`. Filtered by run on the server (the session server holds every test's
    logs), and read page by page: a read returns one page, the oldest first, and a run can log more than a page.
    (Prefect's own text filter answers a server error on SQLite.)"""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    of_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    return any(text in log.message for log in every_page(client.read_logs, log_filter=of_run))


API_PAGE = 200  # the most a read of the Prefect API returns (PREFECT_API_DEFAULT_LIMIT)


def every_page(read, **filters) -> list:
    """Everything a Prefect client's `read` (read_logs, read_flow_runs) finds, read a page at a time."""
    found: list = []
    while page := read(**filters, limit=API_PAGE, offset=len(found)):
        found += page
    return found


def block(path: Path) -> None:
    """Make a shard's output file impossible to write (a directory stands where the file must go): the
    shard's task fails on every try until the obstacle is removed, as with a storage fault."""
    (path / "obstacle").mkdir(parents=True)


def unblock(path: Path) -> None:
    shutil.rmtree(path)


RENUMBERED = (".docs.parquet",)  # written again by number_lines once the pieces of a cut file before are done


def committed(out: Path, stage: str) -> dict[str, dict[str, int]]:
    """Each shard the stage committed (by its marker's name), with the modification stamps of the files it wrote but
    those `number_lines` writes again without redoing the shard: a reused shard keeps them, a redone one writes them
    anew (its marker alone can be written again)."""
    found = {}
    for marker in sorted((out / "_commits" / stage).glob("*.json")):
        files = json.loads(marker.read_text())["files"]
        found[marker.name] = {f: (out / f).stat().st_mtime_ns for f in files if not f.endswith(RENUMBERED)}
    return found


def test_served_deployment_run_fails_then_retry_redoes_only_the_failed_shard(
    gpt2_run, prefect_api, prefect_client, dask_cluster, tmp_path
):
    """Also: the runner's storage is a directory of its own. Prefect's is made under `runner_storage` in the
    temporary directory, a name another user of the host can take first: a link planted there had `tokenmill serve`
    make its directory where the link pointed, and leave it there."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    out = tmp_path / "out"
    overrides = ["--set", "partition.shard_size=1MB"]
    blocked = out / "megatron/train/shard-00001.bin"
    block(blocked)
    temporary, elsewhere = tmp_path / "tmp", tmp_path / "elsewhere"
    temporary.mkdir()
    elsewhere.mkdir()
    (temporary / "runner_storage").symlink_to(elsewhere)
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "TOKENMILL_DASK_ADDRESS": dask_cluster,
        "TMPDIR": str(temporary),
    }
    log = tmp_path / "serve.log"
    # a daily time half a day away: no scheduled run falls due during the test (03:00 did, in a CI run at 03:00)
    cron = f"0 {(datetime.now(UTC).hour + 12) % 24} * * *"
    server = served_process(
        [*TOKENMILL, "serve", "examples/gpt2.yaml", *overrides, "--set", f"output.path={out}",
         "--name", "ops", "--cron", cron], env, log,
    )  # fmt: skip
    try:
        deployment = wait_for(
            lambda: deployment_named(prefect_client, "corpus-to-tokens/ops"), 120, "the served deployment"
        )
        # the cron schedule produces scheduled runs
        of_deployment = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
        scheduled = wait_for(lambda: prefect_client.read_flow_runs(deployment_filter=of_deployment), 180, "runs")
        assert all(r.state.is_scheduled() for r in scheduled), scheduled

        # a run triggered through the API with parameters (the served config): shard 1 cannot be written
        run = prefect_client.create_flow_run_from_deployment(deployment.id, parameters=deployment.parameters)
        state = final_state(prefect_client, run.id)
        assert state.is_failed()
        assert "tokenize: 1 of 4 shards failed" in state.message and "shard 00001" in state.message
        tokenized_before = committed(out, "tokenize")
        assert len(tokenized_before) == 3, state.message  # the other shards committed
        assert not (out / "manifest.json").exists()

        # clear the fault, press Retry (what the UI's button and `prefect flow-run retry` send)
        unblock(blocked)
        assert press_retry(prefect_client, run.id).is_completed()
        # While the deployment is served: the run's process sends its last logs after its final state, and a Ctrl-C
        # to `tokenmill serve` (sent to its whole process group, as a terminal does) can end it before it has.
        reuse = "reused 3 of 4 committed tokenize shards"
        wait_for(lambda: logged(prefect_client, run.id, reuse), 180, "the reuse log")
        assert not list(elsewhere.iterdir())
    finally:
        stop(server, log=log)
    assert [p.name for p in temporary.iterdir()] == ["runner_storage"]  # its own directory removed as it stopped
    assert not list(elsewhere.iterdir())
    said = " ".join(log.read_text().split())  # as the terminal showed it, lines joined
    assert f"""Serving corpus-to-tokens/ops (on "{cron}" (UTC)) and rerun-shards/ops until Ctrl-C""" in said, said
    assert "prefect deployment run 'corpus-to-tokens/ops'" in said

    tokenized_after = committed(out, "tokenize")
    assert len(tokenized_after) == 4
    assert {k: tokenized_after[k] for k in tokenized_before} == tokenized_before  # reused, not recomputed

    # the retried run equals a clean run
    retried, fresh = dataset_files(out), dataset_files(gpt2_run)
    assert json.loads(retried.pop("manifest.json")) == json.loads(fresh.pop("manifest.json"))
    assert retried == fresh


def test_grouped_shards_give_the_same_bytes_and_retry_redoes_only_the_failed_one(
    run_cli, prefect_api, prefect_client, dask_cluster, tmp_path
):
    """More shards than Prefect task runs (dask.groups_per_stage=3: each task run covers a group of 3 or 4
    shards, each shard its own Dask task): the output equals the one-task-run-per-shard run's byte for byte; a
    shard failing on purpose is named by its id in its group's task run and in the flow run's state; Retry
    redoes that shard alone. Both are started in a Prefect project with `flows/` and `tasks/` packages of its own
    (its examples/ the repository's): what they run is tokenmill's."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    project = a_project_of_its_own(tmp_path / "project")
    (project / "examples").symlink_to(REPO / "examples")
    small_shards = ["--set", "partition.shard_size=200KB"]
    single = tmp_path / "single"
    run_cli("run", "examples/gpt2.yaml", *small_shards, "--set", f"output.path={single}", cwd=project)
    n_shards = len(json.loads((single / "plan.json").read_text())["shards"])
    assert n_shards >= 9

    out = tmp_path / "grouped"
    blocked = out / "megatron/train/shard-00004.bin"
    block(blocked)
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "TOKENMILL_DASK_ADDRESS": dask_cluster}
    log = tmp_path / "serve.log"
    server = served_process(
        [*TOKENMILL, "serve", "examples/gpt2.yaml", *small_shards, "--set",
         f"output.path={out}", "--set", "dask.groups_per_stage=3", "--name", "grouped"], env, log, cwd=project,
    )  # fmt: skip
    try:
        deployment = wait_for(
            lambda: deployment_named(prefect_client, "corpus-to-tokens/grouped"), 120, "the served deployment"
        )
        run = prefect_client.create_flow_run_from_deployment(deployment.id, parameters=deployment.parameters)
        state = final_state(prefect_client, run.id)
        assert state.is_failed()
        assert f"tokenize: 1 of {n_shards} shards failed" in state.message and "shard 00004" in state.message

        def tokenize_runs():
            runs = prefect_client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
            runs = [r for r in runs if r.name.startswith("tokenize[")]
            return runs if len(runs) == 3 and all(r.state and r.state.is_final() for r in runs) else None

        groups = {r.name: r.state for r in wait_for(tokenize_runs, 180, "the tokenize task runs")}
        assert len(groups) == 3 and all(name.startswith("tokenize[shards ") for name in groups)
        failed = [name for name, state in groups.items() if state.is_failed()]
        assert len(failed) == 1 and "shard 00004" in groups[failed[0]].message, groups
        first, last = (int(n) for n in failed[0].removeprefix("tokenize[shards ").rstrip("]").split("-"))
        assert first <= 4 <= last
        committed_before = committed(out, "tokenize")
        assert len(committed_before) == n_shards - 1 and "shard-00004.json" not in committed_before

        unblock(blocked)
        assert press_retry(prefect_client, run.id).is_completed()
    finally:
        stop(server, log=log)

    committed_after = committed(out, "tokenize")
    assert set(committed_after) - set(committed_before) == {"shard-00004.json"}
    assert {k: committed_after[k] for k in committed_before} == committed_before  # reused, not recomputed
    grouped, one_per_shard = dataset_files(out), dataset_files(single)
    assert json.loads(grouped.pop("manifest.json")) == json.loads(one_per_shard.pop("manifest.json"))
    assert grouped == one_per_shard


def test_work_pool_deployments_run_on_a_process_worker(prefect_api, prefect_client, dask_cluster, gpt2_run, tmp_path):
    """deployments/prefect.yaml the way deployments/README.md uses it, against a real server: a process work pool,
    `prefect deploy --all`, `prefect worker start`; corpus-to-tokens/nightly runs with another config (as
    `--param config=...` does) and equals a clean run, then rerun-shards/nightly, given that config, redoes one
    shard."""
    from tokenmill.config import load_config

    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    env.pop("TOKENMILL_ROOT", None)  # deployed as a placeholder: each worker resolves it from its own environment

    def prefect(*args: str) -> None:
        done = subprocess.run([bin_dir / "prefect", *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=180)  # fmt: skip
        assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"

    prefect("work-pool", "create", "tokenmill-process", "--type", "process")
    prefect("--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml")
    nightly = prefect_client.read_deployment_by_name("corpus-to-tokens/nightly")
    rerun = prefect_client.read_deployment_by_name("rerun-shards/nightly")
    for schedule in prefect_client.read_deployment_schedules(nightly.id):  # no 02:00 run into the checkout's out/
        prefect_client.update_deployment_schedule(nightly.id, schedule.id, active=False)

    # a temporary directory of its own, as deployments/README.md starts it: Prefect's process worker keeps its runs'
    # storage under `runner_storage` there, a fixed name that in the shared one another user can make first
    worker_tmp = tmp_path / "worker-tmp"
    worker_tmp.mkdir()
    worker_env = {**env, "TOKENMILL_ROOT": str(REPO), "TOKENMILL_DASK_ADDRESS": dask_cluster,
                  "PREFECT_WORKER_QUERY_SECONDS": "2", "TMPDIR": str(worker_tmp)}  # fmt: skip
    with open(tmp_path / "worker.log", "w") as log:
        worker = subprocess.Popen([bin_dir / "prefect", "worker", "start", "--pool", "tokenmill-process"],
                                  cwd=tmp_path, env=worker_env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    try:
        out = tmp_path / "out"
        config = load_config(REPO / "examples/gpt2.yaml", [f"output.path={out}", "partition.shard_size=1MB"])
        run = prefect_client.create_flow_run_from_deployment(
            nightly.id, parameters={"config": config.model_dump(mode="json")}
        )
        state = final_state(prefect_client, run.id, timeout=420)
        assert state.is_completed(), f"{state.message}\n{(tmp_path / 'worker.log').read_text()[-3000:]}"
        built, fresh = dataset_files(out), dataset_files(gpt2_run)
        assert json.loads(built.pop("manifest.json")) == json.loads(fresh.pop("manifest.json"))
        assert built == fresh
        assert (worker_tmp / "runner_storage").is_dir()  # its storage, where it was told: not the shared directory

        before = committed(out, "tokenize")
        redo = prefect_client.create_flow_run_from_deployment(  # the run's config, as the deployment's default is
            rerun.id, parameters={"output": str(out), "shard_ids": [2], "config": config.model_dump(mode="json")}
        )
        assert final_state(prefect_client, redo.id, timeout=420).is_completed()
        after = committed(out, "tokenize")
        assert {name for name in after if after[name] != before[name]} == {"shard-00002.json"}
    finally:
        os.killpg(worker.pid, signal.SIGINT)  # a worker may need a second signal (deployments/README.md)
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(30)


def test_rerun_shards_redoes_exactly_the_named_shards(run_cli, gpt2_run, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(gpt2_run, out)
    before_files, before = dataset_files(out), {s: committed(out, s) for s in ("tokenize", "pack")}
    result = run_cli("rerun", str(out), "--shard", "1", "--shard", "3")
    assert "4 shards (2 reused)" in result.stdout
    # the stage's rate is of the input it tokenized (its MB/s were of the reused shards' input too)
    said = re.search(r"tokenize stage [0-9.]+ MB/s of input \(the 2 of 4 shards it made\)", result.stdout)
    assert said, result.stdout
    for stage in ("tokenize", "pack"):
        after = committed(out, stage)
        changed = {name for name in after if after[name] != before[stage][name]}
        assert changed == {"shard-00001.json", "shard-00003.json"}, stage
    assert dataset_files(out) == before_files

    missing = run_cli("rerun", str(out), "--shard", "9", check=False)
    assert missing.returncode == 1 and "no shards [9]" in missing.stdout


def test_tokenmill_run_sends_flow_run_heartbeats_only_when_asked(gpt2_run, prefect_api):
    """Prefect waits for its heartbeat thread (1 s steps) as a flow run ends: gpt2_run's `tokenmill run` sent no
    heartbeat (its other events are there), and a setting that asks for heartbeats keeps them."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

    from flows.cli import heartbeats_only_if_asked

    run_id = re.search(r"/runs/flow-run/([0-9a-f-]{36})", (gpt2_run.parent / "stdout.txt").read_text()).group(1)
    of_the_run = {"resource": {"id": [f"prefect.flow-run.{run_id}"]}, "event": {"prefix": ["prefect.flow-run."]}}
    query = {"filter": of_the_run, "limit": 50}
    deadline = time.monotonic() + 60  # the server stores events in batches: wait for the run's last one

    def events_now() -> set[str]:
        found = api_post(prefect_api, "events/filter", query).json()["events"]
        return {e["event"] for e in found}

    while "prefect.flow-run.Completed" not in (events := events_now()):
        assert time.monotonic() < deadline, events
        time.sleep(1)
    assert "prefect.flow-run.Running" in events and "prefect.flow-run.heartbeat" not in events
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 60}), heartbeats_only_if_asked():
        assert get_current_settings().flows.heartbeat_frequency == 60


def test_flow_runs_on_an_external_dask_cluster(gpt2_run, dask_cluster, prefect_client):
    """gpt2_run ran on the session's `dask scheduler` + `dask worker` processes: the shard work ran there (each
    worker holds the encoder it loaded), and the Prefect API has a task run per cluster thread (2: 4 shards in 2
    groups)."""
    from distributed import Client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, TaskRunFilter, TaskRunFilterName

    manifest = json.loads((gpt2_run / "manifest.json").read_text())
    assert manifest["counts"]["documents_rejected"] == 0 and manifest["counts"]["tokens"] > 0
    with Client(dask_cluster) as client:
        loaded = client.run(
            lambda: __import__("tokenmill.tokenizers.encoders").tokenizers.encoders.load_encoder.cache_info().currsize
        )
    assert len(loaded) == 2 and sum(loaded.values()) >= 1, loaded
    runs = prefect_client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="tokenize[shard")))
    completed = {r.name for r in runs if r.state.is_completed()}
    assert completed >= {"tokenize[shards 00000-00001]", "tokenize[shards 00002-00003]"}
    assert prefect_client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["demo-gpt2"])))


def test_workers_of_an_external_cluster_load_the_installed_tokenizers_encoders_at_once(
    dask_cluster, prefect_api, prefect_client, tmp_path
):
    """Workers that no forkserver of tokenmill's made (the session's `dask worker`s) load the run's tokenizer as soon
    as the flow has installed it (`flows.main.preload_installed`, the install task's done callback, not awaited).
    (The callback waits for the future before reading its state, which is otherwise read from the Prefect server
    and was seen still Pending for a flow's first task; this test did not catch that race in 3 tries.)"""
    import functools

    from distributed import Client
    from prefect import flow
    from prefect.logging.handlers import APILogHandler
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.main import preload_installed
    from tasks.train_tokenizer import pretrained_tokenizer
    from tokenmill.config import load_config

    config = load_config(REPO / "examples" / "gpt2.yaml", [f"output.path={tmp_path / 'out'}"])

    def every_worker_loaded(client) -> dict | None:
        loaded = client.run(
            lambda: sorted(
                backend for _, backend in __import__("tokenmill.tokenizers.encoders").tokenizers.encoders.LOADED
            )
        )
        return loaded if loaded and all(b == ["gigatoken", "hf"] for b in loaded.values()) else None

    @flow
    def install_and_preload() -> dict:
        with Client(dask_cluster, set_as_default=True) as client:
            client.run(lambda: __import__("tokenmill.tokenizers.encoders").tokenizers.encoders.LOADED.clear())
            installing = pretrained_tokenizer.submit(config)
            installing.add_done_callback(functools.partial(preload_installed, config))
            installing.result()
            return wait_for(lambda: every_worker_loaded(client), 180, "every worker to load the encoders")

    with temporary_settings({PREFECT_API_URL: prefect_api}):
        state = install_and_preload(return_state=True)
        APILogHandler().flush()  # while the server is up: at exit, with the session's server gone, it complained
    assert state.is_completed() and len(state.result()) == 2
    assert prefect_client.read_flow_run(state.state_details.flow_run_id).state.is_completed()  # on the session's server


def test_prefect_server_on_postgresql(tmp_path):
    """A whole run against a Prefect server backed by PostgreSQL (Debian's server, started here), the server
    SIGKILLed once the run's first shard has committed and restarted on the same port and database 3 s later
    (a pod rescheduled): the run completes, recorded as Completed in PostgreSQL. Shards of one input wait at a gate
    (`Gate`) until the server is back: work is left when it goes, however fast the rest."""
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not binaries:
        pytest.skip("PostgreSQL server not installed (make setup installs Debian's postgresql)")
    pg_bin = binaries[-1].parent
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    data = Path(tempfile.mkdtemp(prefix="tokenmill-pg-"))
    if as_postgres:
        shutil.chown(data, "postgres")
    port, api_port = free_port(), free_port()
    subprocess.run([*as_postgres, pg_bin / "initdb", "-D", data / "db", "--auth=trust", "-U", "postgres"],
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run([*as_postgres, pg_bin / "pg_ctl", "-D", data / "db", "-w", "-l", data / "log",
                    "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1", "start"],
                   check=True, capture_output=True)  # fmt: skip
    prefect_server = None
    try:
        subprocess.run(
            [pg_bin / "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "prefect"], check=True
        )
        env = {
            **os.environ,
            "PREFECT_HOME": str(tmp_path / "home"),
            "PREFECT_API_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://postgres@127.0.0.1:{port}/prefect",
        }
        env.pop("PREFECT_API_URL", None)
        from flows.server import healthy

        def start_server():
            return subprocess.Popen(
                [Path(sys.executable).parent / "prefect", "server", "start", "--host", "127.0.0.1",
                 "--port", str(api_port)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

        def sql(query: str) -> str:
            return subprocess.run(
                [pg_bin / "psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "prefect", "-tAc", query],
                capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip

        prefect_server = start_server()
        api = f"http://127.0.0.1:{api_port}/api"
        wait_for(lambda: healthy(api), 120, "prefect server on PostgreSQL")
        out = tmp_path / "out"
        gate = gated_news(tmp_path)
        inputs = f"[examples/data/wikitext2_raw_test.jsonl, {gate.url}]"
        run = subprocess.Popen(
            [*TOKENMILL, "run", "examples/gpt2.yaml", "--set", f"output.path={out}", "--set", f"input.paths={inputs}",
             "--set", "partition.shard_size=128KB", *GATED_RUN],  # 18 shards, 8 of them the news's
            cwd=REPO, env=gate.env({**env, "PREFECT_API_URL": api}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        gate.reached(run)
        wait_for(lambda: any((out / "_commits" / "tokenize").glob("*.json")) or run.poll() is not None, 300, "a shard")
        assert run.poll() is None, run.communicate()[0]  # the server goes mid-run
        os.killpg(prefect_server.pid, signal.SIGKILL)
        prefect_server.wait(30)
        time.sleep(3)
        prefect_server = start_server()
        gate.open()
        log = run.communicate(timeout=600)[0]
        assert run.returncode == 0, log
        planned = int(re.search(r"planned (\d+) shards", log)[1])
        assert planned > 10 and len(list((out / "_commits" / "tokenize").glob("*.json"))) == planned, log
        assert int(sql("select count(*) from task_run where name like 'tokenize[shard%'")) >= 1  # in PostgreSQL
        assert sql("select state_type from flow_run where name = 'demo-gpt2'") == "COMPLETED"
    finally:
        if prefect_server is not None:
            stop(prefect_server, signal.SIGTERM)
        subprocess.run([*as_postgres, pg_bin / "pg_ctl", "-D", data / "db", "-m", "fast", "stop"], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)
