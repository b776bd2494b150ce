"""End to end: the CLI runs the real flow on a real Prefect server, on a Dask LocalCluster (the demo) and on
the session's Dask cluster."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from tokenizers import Tokenizer

from tokenmill.core.hashing import assign_splits
from tokenmill.formats.megatron import MegatronReader
from tokenmill.formats.packed import PackedReader

from .conftest import EXAMPLES, REPO, TOKENIZERS, a_project_of_its_own, alive_in_session, dataset_files, read_jsonl
from .test_faults import PAGE, cached_pages

DEMO_FILES = sorted(p for p in (EXAMPLES / "data").iterdir() if ".jsonl" in p.name)


@pytest.fixture(scope="module")
def demo_run(run_cli, tmp_path_factory):
    """The demo config (a tokenizer trained on a sample) run from scratch on a LocalCluster of one worker."""
    out = tmp_path_factory.mktemp("demo") / "out"
    run_cli("run", "examples/demo.yaml", "--set", f"output.path={out}", "--set", "dask.n_workers=1",
            local_cluster=True)  # fmt: skip
    return out


def test_demo_manifest_counts_match_the_input(demo_run):
    out = demo_run
    manifest = json.loads((out / "manifest.json").read_text())
    documents = sum(len(read_jsonl(p)) for p in DEMO_FILES)
    assert manifest["counts"] == {
        "documents_in": documents,
        "documents_out": documents,
        "documents_rejected": 0,
        "tokens": manifest["counts"]["tokens"],
    }
    splits = manifest["splits"]
    assert sum(s["documents"] for s in splits.values()) == documents
    assert sum(s["tokens"] for s in splits.values()) == manifest["counts"]["tokens"]
    assert manifest["tokenizer"]["trained"] and manifest["tokenizer"]["vocab_size"] == 8000
    for entry in manifest["files"]:
        data = (out / entry["path"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["bytes"], entry["sha256"]), entry["path"]
    megatron_tokens = sum(
        len(MegatronReader(out / e["path"][: -len(".bin")]).tokens)
        for e in manifest["files"]
        if e["kind"] == "megatron-bin"
    )
    assert megatron_tokens == manifest["counts"]["tokens"]


def test_rerun_reuses_every_committed_shard(demo_run, run_cli, tmp_path):
    out = tmp_path / "again"
    shutil.copytree(demo_run, out)
    before = dataset_files(out)
    result = run_cli("run", "examples/demo.yaml", "--set", f"output.path={out}")
    assert "4 shards (4 reused)" in result.stdout
    assert dataset_files(out) == before


def test_recomputing_from_scratch_on_two_workers_gives_the_one_worker_bytes(demo_run, run_cli, tmp_path):
    """Everything but the inputs' plan removed (the published versions too: a published version ends a run over
    its input at once), the tokenizer retrained and every shard redone, on the session's two workers instead of
    one: the same bytes."""
    out = tmp_path / "scratch"
    shutil.copytree(demo_run, out)
    before = dataset_files(out)
    for private in ("_commits", "_work", "megatron", "packed", "tokenizer", "demo"):
        shutil.rmtree(out / private)
    result = run_cli("run", "examples/demo.yaml", "--set", f"output.path={out}")
    assert "(0 reused)" in result.stdout
    assert dataset_files(out) == before


def test_a_flow_given_no_scheduler_starts_its_own_local_cluster():
    """What a served deployment's run does when `dask:` names no scheduler (`tokenmill run` starts its
    LocalCluster itself, before the flow: the demo run above): the shard work runs in a worker process of a
    LocalCluster started for the run, which the stages find as the default client. Its workers never pause for
    memory (a paused worker whose memory does not fall back waits forever: flows/dask_settings.py), and its
    scheduler, in a process of its own, keeps none of the messages it sent them (each holds its task's arguments,
    shard dicts: flows/dask_settings.py). Its workers start with the run's tokenizer's encoders, which the
    forkserver they fork from loaded (flows/clusters/local.py). Its worker samples for the Profile page ten times
    a second and its worker and scheduler tick and monitor once a second, not 100, 50 and 2 times
    (flows.dask_settings.HOUSEKEEPING), and its worker keeps the Profile page's history (a Dask log the
    scheduler's setting had emptied). The cluster's processes end with the flow's."""
    script = textwrap.dedent("""
        import os
        import time
        import dask
        from distributed import default_client
        from flows.cluster import dask_client
        from tokenmill.tokenizers import encoders
        from tokenmill.config import DaskConfig, TokenizerConfig

        def where():
            return os.getpid(), dask.config.get("distributed.worker.memory.pause"), sorted(encoders.LOADED)

        def kept(dask_scheduler):
            return os.getpid(), sum(len(c.recent_message_log) for c in dask_scheduler.stream_comms.values())

        def periods(names, dask_worker=None, dask_scheduler=None):  # ms between the server's housekeeping calls
            callbacks = (dask_worker or dask_scheduler).periodic_callbacks
            return [int(callbacks[name].callback_time) for name in names]

        def busy(seconds):
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                pass

        if __name__ == "__main__":
            with dask_client(DaskConfig(n_workers=1), TokenizerConfig(path=os.environ["TOKENIZER"])):
                client = default_client()
                pid, pauses, loaded = client.submit(where).result()
                scheduler, messages = client.run_on_scheduler(kept)
                where_it_ran = "worker" if pid != os.getpid() else "flow"
                print(where_it_ran, pauses, scheduler != os.getpid(), messages, flush=True)
                print(*(f"{backend}:{sha256}" for sha256, backend in loaded), flush=True)
                [worker] = client.run(periods, ["profile", "tick", "monitor"]).values()
                print(*worker, *client.run_on_scheduler(periods, ["tick", "monitor"]), flush=True)
                client.submit(busy, 1.5).result()
                time.sleep(1.5)  # past a profile cycle (1 s): what the Profile page shows is its history's
                print(client.profile()["count"] >= 5, flush=True)
    """)
    tokenizer = TOKENIZERS / "gpt2" / "tokenizer.json"
    env = {k: v for k, v in os.environ.items() if k != "TOKENMILL_DASK_ADDRESS"} | {"TOKENIZER": str(tokenizer)}
    flow = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    stdout, stderr = flow.communicate(timeout=120)
    lines = stdout.splitlines()
    assert lines[0] == "worker False True 0", stderr[-2000:]
    # the worker started with the run's tokenizer's encoders, loaded once by the forkserver it was forked from
    sha256 = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    assert lines[1].split() == [f"gigatoken:{sha256}", f"hf:{sha256}"], stderr[-2000:]
    assert lines[2] == "100 1000 1000 1000 1000", stderr[-2000:]
    assert lines[3] == "True", stderr[-2000:]  # the Profile page has its samples (ten a second, kept)
    assert not alive_in_session(flow.pid)  # the cluster's processes ended with the flow's


def test_a_run_started_in_a_project_with_its_own_flows_and_tasks_packages_runs_tokenmills(run_cli, tmp_path):
    """A Prefect project has a `flows/` package of its own, and often `tasks/`: `tokenmill run` started in one runs
    tokenmill's, in its LocalCluster's process and workers too (`python -c` puts the working directory first on
    sys.path: the cluster's process died importing the project's `flows`)."""
    project = a_project_of_its_own(tmp_path / "project")
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({
        "name": "in-a-project",
        "input": {"paths": [str(EXAMPLES / "data" / "web_scrapinghub_aeb.jsonl.gz")]},
        "tokenizer": {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json")},
        "pack": {"mode": "none"},
        "output": {"path": str(tmp_path / "out")},
        "dask": {"n_workers": 1},
    }))  # fmt: skip
    run_cli("run", str(config), local_cluster=True, cwd=project)
    (published,) = (tmp_path / "out" / "in-a-project").glob("*/manifest.json")
    assert json.loads(published.read_text())["counts"]["documents_out"] > 0


def test_the_flows_process_never_imports_pandera_nor_fastapi_nor_makes_the_parameters_schema(
    prefect_api, dask_cluster, tmp_path
):
    """Importing pandera replaces `typing._GenericAlias.__call__`, which Prefect calls for each task run's engine
    (`SyncTaskRunEngine[P, R](...)`), with a function that names a class its module defines a few lines later: a
    flow that imported it in a thread while starting tasks failed with `NameError: name 'DataFrameBase' is not
    defined` (`tokenmill.io.readers.schema_library`). The stats table is checked on a worker; the flow's process,
    where Prefect's threads run, imports none of pandera, and the run validates and publishes. Nor FastAPI, which
    Prefect imports to record a flow run's parameters (0.1 s of every run's start: `flows.main.QuickFlow`). Nor does
    it make the parameters' JSON schema, which Prefect makes as a flow is declared (0.2 s: `QuickFlow`)."""
    script = textwrap.dedent("""
        import atexit, sys
        atexit.register(lambda: print(
            "imported:", [m for m in sys.modules if m.startswith(("pandera", "fastapi"))],
            "schema made:", sys.modules["flows.main"].corpus_to_tokens._parameters is not None,
        ))
        from flows.cli import app
        app(sys.argv[1:])
    """)
    out = tmp_path / "out"
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "TOKENMILL_DASK_ADDRESS": dask_cluster}
    result = subprocess.run([sys.executable, "-c", script, "run", "examples/gpt2.yaml", "--set", f"output.path={out}"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "imported: [] schema made: False", result.stdout[-3000:]
    assert list(out.glob("demo-gpt2/*/manifest.json"))


def test_a_runs_parameters_are_recorded_as_prefect_records_them(tmp_path):
    """`QuickFlow` writes a run's parameters without FastAPI, and exactly as Prefect's own `serialize_parameters`
    (FastAPI's `jsonable_encoder`) does: the config by its aliases, the plan being made as a placeholder, anything
    else Prefect's way."""
    from pathlib import PurePosixPath

    from prefect import Flow

    from flows.main import corpus_to_tokens
    from tokenmill.config import load_config
    from tokenmill.stages.partition import PlanAhead

    config = load_config(EXAMPLES / "gpt2.yaml", [f"output.path={tmp_path / 'out'}"])
    ahead = PlanAhead.start(config, 1)
    ahead.made.result()
    for parameters in (
        {"config": config, "rebuild": False, "plan_ahead": ahead},
        {"config": config, "rebuild": True, "plan_ahead": None},
        {"config": config, "other": [1, 2.5, {"path": PurePosixPath("/a/b")}]},
    ):
        written = corpus_to_tokens.serialize_parameters(parameters)
        assert written == Flow.serialize_parameters(corpus_to_tokens, parameters)
        assert written["config"]["name"] == "demo-gpt2" and json.dumps(written)
    assert written["other"] == [1, 2.5, {"path": "/a/b"}]


def test_the_flows_parameters_schema_is_prefects_made_when_read():
    """`QuickFlow` makes its parameters' JSON schema only when `parameters` is read: then it is Prefect's own, what a
    deployment of the flow shows in the UI's run form; and Flow.__init__ makes it for any other flow, as before."""
    from prefect import Flow
    from prefect.utilities.callables import parameter_schema

    from flows.main import QuickFlow, corpus_to_tokens

    def other(config: int = 1) -> None:
        pass

    assert corpus_to_tokens.parameters == parameter_schema(corpus_to_tokens.fn)
    assert set(corpus_to_tokens.parameters.properties) == {"config", "rebuild"}  # plan_ahead is not a parameter's
    assert Flow(other).parameters == parameter_schema(other) == QuickFlow(other).parameters
    assert QuickFlow(other)._parameters is None


def test_a_run_that_packs_nothing_publishes_the_packing_runs_megatron_files(gpt2_run, run_cli, tmp_path):
    """`pack.mode: none` (Megatron's layout alone, as bench/megatron.py runs it): no pack stage, so each shard's
    check of its files follows its tokenize directly; the Megatron files are the packing run's, byte for byte. No
    stage reads a `.bin` whole again, so each is written around the page cache and read back around it by its check:
    the cache holds only what validate's reference sample read of them."""
    out = tmp_path / "out"
    run_cli("run", "examples/gpt2.yaml", "--set", f"output.path={out}", "--set", "partition.shard_size=1MB",
            "--set", "pack.mode=none")  # fmt: skip
    bins = sorted(out.glob("megatron/*/shard-*.bin"))
    pages = sum(-(-path.stat().st_size // PAGE) for path in bins)
    assert bins and sum(map(cached_pages, bins)) < pages  # by hand: 226 of 412; written through the cache, all
    files, packing_run = dataset_files(out), dataset_files(gpt2_run)
    megatron = {path: data for path, data in packing_run.items() if path.startswith("megatron/")}
    assert megatron and {path: data for path, data in files.items() if path.startswith("megatron/")} == megatron
    assert not [path for path in files if path.startswith(("packed/", "llmc/"))]


def test_gpt2_token_ids_equal_the_reference_for_every_document(gpt2_run):
    out = gpt2_run
    reference = Tokenizer.from_file(str(TOKENIZERS / "gpt2" / "tokenizer.json"))
    eod = reference.token_to_id("<|endoftext|>")
    docs = [d for path in DEMO_FILES for d in read_jsonl(path)]
    split_of = assign_splits([d["id"] for d in docs], {"train": 0.99, "val": 0.01})
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == "uint16" and manifest["tokenizer"]["eod_id"] == eod == 50256

    for index, split in enumerate(("train", "val")):
        expected = [reference.encode(d["text"], add_special_tokens=False).ids + [eod]
                    for d, s in zip(docs, split_of, strict=True) if s == index]  # fmt: skip
        prefixes = sorted(out / e["path"][: -len(".bin")] for e in manifest["files"]
                          if e["kind"] == "megatron-bin" and e["split"] == split)  # fmt: skip
        got = [reader[i].tolist() for p in prefixes for reader in [MegatronReader(p)] for i in range(len(reader))]
        assert len(got) == len(expected) and got == expected, split

        # the packed rows hold the same stream, cut at seq_len, boundaries at document ends
        for prefix in prefixes:
            stream = np.concatenate([MegatronReader(prefix)[i] for i in range(len(MegatronReader(prefix)))])
            packed = PackedReader(str(prefix).replace("/megatron/", "/packed/"))
            rows = [packed[i] for i in range(len(packed))]
            assert np.array_equal(np.concatenate([tokens[: cu[-1]] for tokens, cu in rows]), stream)
            ends = {
                int(e) for e in np.cumsum([len(MegatronReader(prefix)[i]) for i in range(len(MegatronReader(prefix)))])
            }
            for i, (_, cu) in enumerate(rows):
                assert {i * 2048 + int(c) for c in cu[1:-1]} <= ends

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from megatron.core.datasets.indexed_dataset import IndexedDataset
        except ImportError:
            return
    for entry in manifest["files"]:
        if entry["kind"] == "megatron-bin":
            prefix = str(out / entry["path"][: -len(".bin")])
            ours = MegatronReader(prefix)
            theirs = IndexedDataset(prefix)
            assert len(theirs) == len(ours)
            assert all(np.array_equal(np.array(theirs[i]), ours[i]) for i in range(len(ours)))
            del theirs
