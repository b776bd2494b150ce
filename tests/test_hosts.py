"""tokenmill across hosts, locked down (tests/hosts.py: network namespaces on a bridge, each host its own address
and /tmp): the S3 server, the Dask scheduler, two workers and the flow (with its own Prefect server) each on a
host of its own, sharing nothing but the network. The scheduler and workers speak only mutual TLS, each with its own
certificate and key (`tokenmill certs`), which only that host has. A run there publishes what a LocalCluster run
publishes; a flow, a worker or a bare connection without a certificate of the cluster's authority is refused
over the network, the flow with a clear message. The link faults (a worker cut off for 60 s, for good, the
scheduler's host for 20 s, for good) are slow: `make slow` runs them."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tokenmill.commands.certs import make_certificates

from .conftest import REPO, TOKENIZERS, TOKENMILL, dataset_files
from .hosts import Network, wait_for

UNAVAILABLE = Network.available()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"cannot make hosts here: {UNAVAILABLE}")

BIN = Path(sys.executable).parent
S3_PORT, SCHEDULER_PORT = 5000, 8786
RUN_CEILING_S = 900  # the longest a run may take, faults and all, before it counts as hung
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
# What infra/ gives its Dask scheduler (flows/dask_settings.py says why).
COMPOSE = yaml.safe_load((REPO / "infra" / "compose.yaml").read_text())
SCHEDULER_ENV = {  # as compose hands them over with none of its variables set: `${VAR:-default}` is the default
    name: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))
    for name, value in COMPOSE["services"]["dask-scheduler"]["environment"].items()
}
# The files that record where the input and the tokenizer were (s3:// on the hosts, a path in the local run).
NAMING_PATHS = {"manifest.json", "plan.json", "report/fertility.md", "report/fertility.json"}
ROLE_FILES = {"scheduler": "scheduler", "worker": "worker", "flow": "client"}
ROLES = "flows.clusters.roles"  # the preload `tokenmill certs` tells the scheduler and the workers to load


def base_env() -> dict[str, str]:
    """A host's environment: none of the test process's settings that name its own servers."""
    return {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "PYTHONFAULTHANDLER": "1"}


def give_certificate(certs: Path, host, role: str) -> None:
    """Copy the authority's certificate and `role`'s certificate and key into the host's own /tmp."""
    for name in ("ca.pem", f"{ROLE_FILES[role]}.pem", f"{ROLE_FILES[role]}-key.pem"):
        shutil.copy2(certs / name, host.root / name)


def tls_flags(role: str) -> list[str]:
    name = ROLE_FILES[role]
    return ["--tls-ca-file", "/tmp/ca.pem", "--tls-cert", f"/tmp/{name}.pem", "--tls-key", f"/tmp/{name}-key.pem"]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """The hosts, their servers started and ready: s3, scheduler, worker-1, worker-2 (with the S3 credentials,
    as a cluster's nodes hold them), and flow (a login node: the run's own Prefect server starts there)."""
    import boto3

    root = tmp_path_factory.mktemp("hosts")
    with Network(root) as network:
        s3, scheduler, flow = network.add("s3"), network.add("scheduler"), network.add("flow")
        workers = [network.add(f"worker-{k}") for k in (1, 2)]
        endpoint = f"http://{s3.ip}:{S3_PORT}"
        s3.start([str(BIN / "moto_server"), "-H", s3.ip, "-p", str(S3_PORT)], base_env(), "moto.log")
        certs = root / "authority"  # the documented step, on the operator's machine
        made = subprocess.run([*TOKENMILL, "certs", str(certs), "--host", scheduler.ip],
                              cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert made.returncode == 0, made.stdout + made.stderr
        assert "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT=" in made.stdout
        assert all(
            (certs / f"{r}-key.pem").stat().st_mode & 0o077 == 0 for r in ("ca", "scheduler", "worker", "client")
        )
        give_certificate(certs, scheduler, "scheduler")
        address = f"tls://{scheduler.ip}:{SCHEDULER_PORT}"
        scheduler.start(
            [str(BIN / "dask"), "scheduler", "--protocol", "tls", "--host", scheduler.ip, "--port", str(SCHEDULER_PORT),
             "--dashboard-address", f"{scheduler.ip}:8787", *tls_flags("scheduler"), "--preload", ROLES],
            base_env() | SCHEDULER_ENV, "scheduler.log",
        )  # fmt: skip
        from flows.dask_settings import WORKER_ENVIRONMENT

        worker_env = base_env() | WORKER_ENVIRONMENT | CREDENTIALS | {"AWS_ENDPOINT_URL": endpoint}
        for worker in workers:
            give_certificate(certs, worker, "worker")
            worker.start(worker_command(address, worker.ip, tls=True), worker_env, "worker.log", restart=True)
        give_certificate(certs, flow, "flow")

        s3_client = boto3.client("s3", endpoint_url=endpoint, **client_credentials())
        wait_for(lambda: try_call(s3_client.list_buckets), 120, f"the S3 server at {endpoint}")
        for bucket in ("corpus", "datasets"):
            s3_client.create_bucket(Bucket=bucket)
        for path in sorted((REPO / "examples" / "data").glob("*.jsonl*")):
            s3_client.upload_file(str(path), "corpus", f"demo/{path.name}")
        s3_client.upload_file(str(TOKENIZERS / "gpt2" / "tokenizer.json"), "corpus", "gpt2/tokenizer.json")
        wait_for(lambda: workers_joined(scheduler, certs) == 2, 180, "two workers joined the scheduler")
        yield SimpleNamespace(
            network=network, s3=s3, scheduler=scheduler, flow=flow, workers=workers, address=address,
            endpoint=endpoint, s3_client=s3_client, certs=certs, root=root, worker_env=worker_env,
        )  # fmt: skip


def client_credentials() -> dict:
    return {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def try_call(call):
    try:
        return call() or True
    except Exception:
        return False


def worker_command(address: str, ip: str, tls: bool) -> list[str]:
    return [
        str(BIN / "dask"), "worker", address, "--host", ip, "--nthreads", "1", "--memory-limit", "4GiB",
        "--dashboard-address", f"{ip}:0", "--local-directory", "/tmp/dask", *(tls_flags("worker") if tls else []),
        "--preload", ROLES, "--preload-nanny", ROLES,
    ]  # fmt: skip


def security_of(certs: Path, role: str = "client"):
    """Dask's TLS settings for a process showing `role`'s certificate of the authority in `certs`."""
    from distributed.security import Security

    return Security(
        tls_ca_file=str(certs / "ca.pem"), tls_client_cert=str(certs / f"{role}.pem"),
        tls_client_key=str(certs / f"{role}-key.pem"), require_encryption=True,
    )  # fmt: skip


def workers_joined(scheduler, certs: Path) -> int:
    """The workers the scheduler has, asked from the test's process over the bridge with the client's certificate."""
    from distributed import Client

    try:
        with Client(f"tls://{scheduler.ip}:{SCHEDULER_PORT}", security=security_of(certs), timeout=10) as client:
            return len(client.scheduler_info()["workers"])
    except OSError:
        return 0


def flow_env(hosts, tls: bool = True) -> dict[str, str]:
    env = base_env() | CREDENTIALS | {
        "AWS_ENDPOINT_URL": hosts.endpoint, "TOKENMILL_DASK_ADDRESS": hosts.address, "PREFECT_HOME": "/tmp/prefect",
        "PREFECT_LOGGING_LEVEL": "WARNING", "COLUMNS": "200",
    }  # fmt: skip
    if tls:
        env |= {
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": "/tmp/ca.pem",
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": "/tmp/client.pem",
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": "/tmp/client-key.pem",
            "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
        }
    return env


def start_on_flow_host(hosts, name: str, tls: bool = True, shard_size: str = "1MB", env: dict | None = None):
    """`tokenmill run` started on the flow's host, of examples/gpt2.yaml with its input, tokenizer and output in
    S3 (`s3://datasets/NAME`), with `env` added to its environment; the process, and its log (what the person who
    ran it saw)."""
    config = yaml.safe_load((REPO / "examples" / "gpt2.yaml").read_text())
    config["input"]["paths"] = ["s3://corpus/demo/*.jsonl*"]
    config["tokenizer"]["path"] = "s3://corpus/gpt2/tokenizer.json"
    config["partition"]["shard_size"] = shard_size
    config["output"] = {"path": f"s3://datasets/{name}"}
    (hosts.flow.root / f"{name}.yaml").write_text(yaml.safe_dump(config))
    log = hosts.flow.root / f"{name}.log"
    command = [*TOKENMILL, "run", f"/tmp/{name}.yaml"]
    return hosts.flow.start(command, flow_env(hosts, tls) | (env or {}), log.name), log


def finish(process, log: Path, timeout: float = RUN_CEILING_S) -> tuple[int, str]:
    """The run's exit code and what it printed; a run still going after `timeout` s has hung: killed, failed."""
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGABRT)  # the fault handler prints every thread's stack into the log
        time.sleep(2)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise AssertionError(f"the run hung ({timeout} s):\n{log.read_text(errors='replace')[-8000:]}") from None
    return process.returncode, log.read_text(errors="replace")


def run_on_flow_host(hosts, name: str, tls: bool = True, shard_size: str = "1MB", env: dict | None = None):
    return finish(*start_on_flow_host(hosts, name, tls, shard_size, env))


def s3_dataset_files(hosts, name: str) -> dict[str, bytes]:
    def read(key: str) -> bytes:
        return hosts.s3_client.get_object(Bucket="datasets", Key=f"{name}/{key}")["Body"].read()

    manifest = json.loads(read("manifest.json"))
    files = {f["path"]: read(f["path"]) for f in manifest["files"]}
    files["manifest.json"] = read("manifest.json")
    return files


@pytest.fixture(scope="module")
def clean_run(hosts) -> dict[str, bytes]:
    """The published files of a run across the hosts with no fault."""
    rc, said = run_on_flow_host(hosts, "clean")
    assert rc == 0, said
    assert "Traceback" not in said, said
    return s3_dataset_files(hosts, "clean")


def test_a_run_across_hosts_publishes_what_a_local_run_does(clean_run, gpt2_run):
    """Every address, bind and path the product uses works across hosts that share no disk: the flow finds the
    scheduler by its address, the workers read the input and tokenizer from S3 and write the shards there, and
    the flow validates and publishes from S3."""
    built, local = clean_run, dataset_files(gpt2_run)
    assert set(built) == set(local)
    same = sorted(p for p in set(built) - NAMING_PATHS if not p.endswith(".docs.parquet"))  # these name input files
    assert {p: built[p] for p in same} == {p: local[p] for p in same}
    assert [p for p in same if p.endswith(".bin")]  # the token files are among them


def test_a_flow_or_a_worker_without_the_clusters_certificate_is_refused_across_the_network(hosts):
    # a flow with no certificate: told what to set, nothing run
    rc, said = run_on_flow_host(hosts, "no-certificate", tls=False)
    assert rc == 1 and "Traceback" not in said, said
    assert f"the Dask scheduler at {hosts.address} speaks TLS and this process has no certificate" in said
    # a flow whose certificate another authority signed: the scheduler refuses it
    other = hosts.root / "other-authority"
    make_certificates(other, [])
    for name in ("ca.pem", "client.pem", "client-key.pem"):
        shutil.copy2(other / name, hosts.flow.root / name)
    try:
        rc, said = run_on_flow_host(hosts, "other-authority")
    finally:
        give_certificate(hosts.certs, hosts.flow, "flow")
    assert rc == 1 and "Traceback" not in said, said
    assert f"could not connect to the Dask scheduler at {hosts.address}" in said
    listed = hosts.s3_client.list_objects_v2(Bucket="datasets", Prefix="no-certificate/").get("KeyCount", 0)
    listed += hosts.s3_client.list_objects_v2(Bucket="datasets", Prefix="other-authority/").get("KeyCount", 0)
    assert listed == 0

    # a worker with no certificate, on a host of its own: it does not join, and ends
    stranger = hosts.network.add("stranger")
    process = stranger.start(worker_command(hosts.address, stranger.ip, tls=False), hosts.worker_env, "worker.log")
    assert process.wait(180) != 0, (stranger.root / "worker.log").read_text()
    assert workers_joined(hosts.scheduler, hosts.certs) == 2

    # a bare TLS connection that trusts the cluster's authority but shows no certificate: the scheduler ends it
    context = ssl.create_default_context(cafile=str(hosts.certs / "ca.pem"))
    context.check_hostname = False
    with pytest.raises((ssl.SSLError, ConnectionError)):
        with socket.create_connection((hosts.scheduler.ip, SCHEDULER_PORT), timeout=30) as raw:
            with context.wrap_socket(raw) as connection:
                connection.sendall(b"hello")
                if not connection.recv(16):  # TLS 1.3: the refusal comes after the handshake, as the stream's end
                    raise ConnectionError("the scheduler closed the connection")


def test_a_workers_certificate_cannot_act_as_a_client(hosts):
    """A worker's certificate serves and connects, so TLS alone lets it do what a client does. The scheduler and
    the workers (preload flows.clusters.roles) refuse it what only a client or the scheduler does: registering as
    a client, running a function on the scheduler or on a worker; the client's certificate does all of it."""
    import asyncio

    from distributed import Client, rpc
    from distributed.protocol.pickle import dumps

    with Client(hosts.address, security=security_of(hosts.certs), timeout=30) as client:
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == 2 and sorted(client.run(os.getpid)) == workers
    with pytest.raises(OSError):  # the scheduler ends the connection at once
        Client(hosts.address, security=security_of(hosts.certs, "worker"), timeout=30)
    said = (hosts.scheduler.root / "scheduler.log").read_text()
    assert "refused 'register-client' to tls://" in said and "it shows a worker's certificate" in said

    async def as_worker(address: str, op: str, **arguments):
        args = security_of(hosts.certs, "worker").get_connection_args("client")
        async with rpc(address, connection_args=args) as server:
            return await getattr(server, op)(**arguments)

    for address, op in ((hosts.address, "run_function"), (workers[0], "run")):
        with pytest.raises(PermissionError, match="refused, this connection shows a worker's certificate"):
            asyncio.run(as_worker(address, op, function=dumps(os.getpid)))
    assert asyncio.run(as_worker(hosts.address, "ncores"))  # what a worker may ask, it still gets


def test_plain_tcp_to_a_scheduler_on_another_host_is_refused(hosts):
    """`tcp://` to the scheduler's host (a network namespace of its own): the run stops before it connects and
    says how to get certificates; nothing is written."""
    plain = {"TOKENMILL_DASK_ADDRESS": f"tcp://{hosts.scheduler.ip}:{SCHEDULER_PORT}"}
    rc, said = run_on_flow_host(hosts, "plain-tcp", tls=False, env=plain)
    assert rc == 1 and "Traceback" not in said, said
    assert f"plain TCP on another host ({hosts.scheduler.ip})" in said and "tokenmill certs" in said, said
    assert hosts.s3_client.list_objects_v2(Bucket="datasets", Prefix="plain-tcp/").get("KeyCount", 0) == 0


def committed(hosts, name: str, stage: str) -> int:
    listed = hosts.s3_client.list_objects_v2(Bucket="datasets", Prefix=f"{name}/_commits/{stage}/")
    return listed.get("KeyCount", 0)


@pytest.fixture(scope="module")
def clean_small_shards(hosts) -> dict[str, bytes]:
    """A run with no fault, in the faulted runs' smaller shards (14 of them: a fault lands among them)."""
    rc, said = run_on_flow_host(hosts, "clean-small", shard_size=SMALL_SHARDS)
    assert rc == 0, said
    return s3_dataset_files(hosts, "clean-small")


SMALL_SHARDS = "256KB"
# Whose link is cut, and for how long: a worker's for a while, or for good (the rerun has one worker); the
# scheduler's host for a while, or for good (the run cannot finish: it must say so; the link is back for the rerun).
LINK_FAULTS = {
    "worker for 60 s": ("worker", 60),
    "worker for good": ("worker", None),
    "scheduler for 20 s": ("scheduler", 20),
    "scheduler for good": ("scheduler", None),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(LINK_FAULTS))
def test_a_link_cut_mid_run_loses_and_duplicates_nothing_and_the_rerun_is_identical(hosts, clean_small_shards, fault):
    role, down_s = LINK_FAULTS[fault]
    victim = hosts.workers[0] if role == "worker" else hosts.scheduler
    name = "fault-" + fault.replace(" ", "-")
    process, log = start_on_flow_host(hosts, name, shard_size=SMALL_SHARDS)
    wait_for(lambda: committed(hosts, name, "tokenize") or process.poll() is not None, 300, "a first shard committed")
    assert process.poll() is None, f"the run ended before the fault:\n{log.read_text()}"
    victim.cut()
    started = time.monotonic()
    back = threading.Timer(down_s, victim.restore) if down_s is not None else None
    try:
        if back is not None:
            back.start()
        rc, said = finish(process, log)
        print(f"{fault}: the run ended {time.monotonic() - started:.0f} s into the fault, exit code {rc}")
        if back is not None:
            back.join()  # the link back before the rerun
        elif role == "scheduler":
            victim.restore()
        assert "Traceback" not in said, said
        if rc == 0:
            assert s3_dataset_files(hosts, name) == clean_small_shards
        else:  # only a scheduler gone for good may fail a run, saying so
            assert fault == "scheduler for good", said
            assert "error: run failed: lost the Dask scheduler mid-run" in said, said
        rc, said = run_on_flow_host(hosts, name, shard_size=SMALL_SHARDS)
        assert rc == 0, said
        assert s3_dataset_files(hosts, name) == clean_small_shards
    finally:
        if back is not None:
            back.cancel()
        victim.restore()
    wait_for(lambda: workers_joined(hosts.scheduler, hosts.certs) == 2, 300, "both workers back with the scheduler")
