"""Mutual TLS for a Dask cluster that other hosts can reach (`tokenmill certs`): a scheduler and workers started
with the cluster's certificates run a `tokenmill run` whose flow has its own, and publish what a run on a plain
cluster publishes; a flow, a worker or a bare TLS connection without a certificate of the cluster's authority
is refused, by the scheduler, with a clear message to the flow."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.server import free_port
from tokenmill.certs import make_certificates

from .conftest import REPO, STOP_CEILING, WORKER_ENV, dataset_files, served_process, stop


def tls_environment(certs: Path, address: str) -> dict[str, str]:
    """What `tokenmill certs` tells the flow's process to set."""
    return {
        "TOKENMILL_DASK_ADDRESS": address,
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(certs / "ca.pem"),
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(certs / "client.pem"),
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(certs / "client-key.pem"),
        "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
    }


@pytest.fixture(scope="module")
def tls_cluster(s3_server, tmp_path_factory):
    """`dask scheduler` and two `dask worker` processes on 127.0.0.1 speaking only TLS, with the certificates
    `tokenmill certs` made."""
    from distributed import Client
    from distributed.security import Security

    work = tmp_path_factory.mktemp("tls")
    certs = work / "certs"
    made = subprocess.run(
        [sys.executable, "-m", "tokenmill", "certs", str(certs)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT=" in made.stdout
    assert all((certs / f"{name}-key.pem").stat().st_mode & 0o077 == 0 for name in ("ca", "scheduler", "worker"))
    dask, port = str(Path(sys.executable).parent / "dask"), free_port()
    address = f"tls://127.0.0.1:{port}"
    tls = ["--tls-ca-file", str(certs / "ca.pem")]
    loopback = ["--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0"]
    processes = [
        served_process(
            [
                dask,
                "scheduler",
                "--protocol",
                "tls",
                "--port",
                str(port),
                *loopback,
                *tls,
                "--tls-cert",
                str(certs / "scheduler.pem"),
                "--tls-key",
                str(certs / "scheduler-key.pem"),
            ],
            dict(os.environ),
            work / "scheduler.log",
        )  # fmt: skip
    ]
    worker = [dask, "worker", address, "--nthreads", "1", "--memory-limit", "4GiB", *loopback, *tls,
              "--tls-cert", str(certs / "worker.pem"), "--tls-key", str(certs / "worker-key.pem")]  # fmt: skip
    processes += [served_process(worker, {**os.environ, **WORKER_ENV}, work / f"worker-{k}.log") for k in range(2)]
    security = Security(
        tls_ca_file=str(certs / "ca.pem"), tls_client_cert=str(certs / "client.pem"),
        tls_client_key=str(certs / "client-key.pem"), require_encryption=True,
    )  # fmt: skip
    with Client(address, security=security, timeout=STOP_CEILING) as client:
        client.wait_for_workers(2, timeout=STOP_CEILING)
    yield SimpleNamespace(address=address, certs=certs, security=security, work=work, worker=worker)
    for process in reversed(processes):
        stop(process, signal.SIGTERM)


def test_a_run_on_a_cluster_that_speaks_only_tls_publishes_what_a_plain_one_does(
    run_cli, gpt2_run, tls_cluster, monkeypatch, tmp_path
):
    for name, value in tls_environment(tls_cluster.certs, tls_cluster.address).items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    run_cli(
        "run",
        "examples/gpt2.yaml",
        "--set",
        f"output.path={out}",
        "--set",
        "partition.shard_size=1MB",
        local_cluster=True,
    )  # fmt: skip  (the address is the environment's, not the session cluster's)
    built, plain = dataset_files(out), dataset_files(gpt2_run)
    assert json.loads(built.pop("manifest.json")) == json.loads(plain.pop("manifest.json"))
    assert built == plain


def test_a_flow_a_worker_or_a_connection_without_the_clusters_certificate_is_refused(
    run_cli, tls_cluster, monkeypatch, tmp_path
):
    from distributed import Client

    def run(environment: dict) -> str:
        for name in tls_environment(tls_cluster.certs, "").keys():
            monkeypatch.delenv(name, raising=False)
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        result = run_cli("run", "examples/gpt2.yaml", "--set", f"output.path={tmp_path / 'out'}", check=False,
                         local_cluster=True)  # fmt: skip
        said = result.stdout + result.stderr
        assert result.returncode == 1 and "Traceback" not in said, said
        assert not (tmp_path / "out" / "manifest.json").exists()
        return said

    # a flow with no certificate: told what to set
    said = run({"TOKENMILL_DASK_ADDRESS": tls_cluster.address})
    assert f"the Dask scheduler at {tls_cluster.address} speaks TLS and this process has no certificate" in said
    # a flow with a certificate of another authority: refused by the scheduler
    other = tmp_path / "other"
    make_certificates(other, [])
    said = run(tls_environment(other, tls_cluster.address))
    assert f"could not connect to the Dask scheduler at {tls_cluster.address}" in said

    # a worker with no certificate does not join, and ends
    stranger = [part for part in tls_cluster.worker if "tls-" not in part and ".pem" not in part]
    log = tmp_path / "stranger.log"
    process = served_process(stranger, {**os.environ, **WORKER_ENV}, log)
    try:
        assert process.wait(STOP_CEILING) != 0, log.read_text()
    finally:
        if process.poll() is None:
            stop(process, signal.SIGTERM, log)
    with Client(tls_cluster.address, security=tls_cluster.security, timeout=STOP_CEILING) as client:
        assert len(client.scheduler_info()["workers"]) == 2

    # a bare TLS connection that trusts the cluster's authority but shows no certificate: the scheduler ends it
    host, port = tls_cluster.address.removeprefix("tls://").split(":")
    context = ssl.create_default_context(cafile=str(tls_cluster.certs / "ca.pem"))
    context.check_hostname = False
    with pytest.raises((ssl.SSLError, ConnectionError)):
        with socket.create_connection((host, int(port)), timeout=30) as raw, context.wrap_socket(raw) as connection:
            connection.sendall(b"hello")
            if not connection.recv(16):  # TLS 1.3: the refusal arrives after the handshake, as the end of the stream
                raise ConnectionError("the scheduler closed the connection")
