"""A few trials of the fault campaign (bench/faults.py) on real `tokenmill run`s: a Dask worker SIGKILLed, the
flow's process SIGKILLed mid-run and while publishing, the build's disk full, a committed file damaged, the
Prefect server killed and restarted mid-run, the server killed and left down, a worker killed for memory by a
document larger than its limit (S3 faults: tests/test_faults_s3.py). Each faulted run ends
(completed, or failed naming what happened), and its rerun publishes files byte-identical to a clean run's,
every document once. A campaign, slow (8 minutes of the suite): `make slow` runs it; `make faults` runs the whole
campaign (every kind, 20 trials each)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from .conftest import REPO


def load_campaign():
    spec = importlib.util.spec_from_file_location("faults_campaign", REPO / "bench" / "faults.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def campaign(tmp_path, kinds: str, seed: int) -> tuple[int, dict]:
    faults = load_campaign()
    report = tmp_path / "report.json"
    status = faults.main(
        [
            "--trials", "1", "--kinds", kinds, "--seed", str(seed), "--corpus-mb", "0.6", "--shard-size", "48KB",
            "--work", str(tmp_path / "work"), "--report", str(report), "--hang-s", "300", "--big-mb", "16",
        ]
    )  # fmt: skip
    table = {row["kind"]: row for row in json.loads(report.read_text())["table"]}
    assert set(table) == set(kinds.split(","))
    return status, table


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mount") is None, reason="needs mount")
def test_a_few_trials_of_each_flow_level_fault(tmp_path):
    status, table = campaign(tmp_path, "worker_kill,flow_kill,publish_kill,disk_full,corruption,server", seed=15)
    check(status, table)


@pytest.mark.slow
def test_a_server_left_down_and_a_worker_killed_for_memory(tmp_path, monkeypatch):
    """Prefect's client retries cut to one, so the run left without its server fails in seconds rather than the
    default's 2.5 minutes (docs/guarantees.md, Prefect server outages)."""
    monkeypatch.setenv("PREFECT_CLIENT_MAX_RETRIES", "1")
    status, table = campaign(tmp_path, "server_outage,oom", seed=159)  # the kill at 36% of a clean run
    check(status, table)


def check(status: int, table: dict) -> None:
    for kind, row in table.items():
        assert row["fault landed mid-run"] == row["trials"], kind  # else the trial tested nothing
        assert row["hung"] == 0, kind
        assert row["byte_identical"] == row["trials"] == 1, kind
        assert row["documents lost or duplicated"] == 0, kind
        assert row["failed with a clear error"] == row["failed"], kind
        assert row["rerun completed"] == 1, kind
    assert status == 0
