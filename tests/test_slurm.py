"""`dask.slurm`: the run's workers as jobs of a real SLURM (Debian's slurmctld and slurmd on this host, with their
own munged, configured here; `make slurm` installs them). A run on SLURM jobs, its scheduler and workers speaking
TLS with certificates made for the run, publishes what a LocalCluster run publishes; worker jobs cancelled mid-run
(`scancel`) are replaced, their shards retried, and the output is the same bytes."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import yaml

from .conftest import REPO, STOP_CEILING, TOKENMILL, dataset_files

DAEMONS = ("munged", "slurmctld", "slurmd")


def _sbin(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


pytestmark = pytest.mark.skipif(
    not all(_sbin(d) for d in DAEMONS) or not shutil.which("sbatch") or os.geteuid() != 0,
    reason="needs Debian's slurm-wlm and munge, run as root (make slurm installs them)",
)


def slurm_conf(work: Path) -> str:
    host = socket.gethostname()
    return f"""\
ClusterName=tokenmill
SlurmctldHost={host}
SlurmUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket={work}/munge.socket
StateSaveLocation={work}/state
SlurmdSpoolDir={work}/spool
SlurmctldPidFile={work}/slurmctld.pid
SlurmdPidFile={work}/slurmd.pid
SlurmctldLogFile={work}/slurmctld.log
SlurmdLogFile={work}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
NodeName={host} CPUs={os.cpu_count()} RealMemory=16000 State=UNKNOWN
PartitionName=tokenmill Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def jobs(env: dict) -> list[str]:
    """The ids of the jobs SLURM holds now (pending or running)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=60)
    return out.stdout.split()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """munged, slurmctld and slurmd for this module, with their state, sockets and logs in a temporary directory;
    SLURM_CONF names its config for the commands (sbatch, squeue, scancel) the tests and tokenmill run."""
    work = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (work / sub).mkdir()
    (work / "slurm.conf").write_text(slurm_conf(work))
    key = work / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    env = {**os.environ, "SLURM_CONF": str(work / "slurm.conf")}
    munge = [
        _sbin("munged"), "--force", f"--key-file={key}", f"--socket={work}/munge.socket",
        f"--pid-file={work}/munged.pid", f"--log-file={work}/munged.log", f"--seed-file={work}/munged.seed",
    ]  # fmt: skip
    started = [
        subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        for command in (
            munge,
            [_sbin("slurmctld"), "-f", env["SLURM_CONF"]],
            [_sbin("slurmd"), "-f", env["SLURM_CONF"]],
        )
    ]
    try:
        assert all(s.returncode == 0 for s in started), [s.stderr for s in started]
        deadline = time.monotonic() + STOP_CEILING
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, (work / "slurmctld.log").read_text()[-3000:]
            time.sleep(1)
        yield SimpleNamespace(env=env, work=work)
    finally:
        for job in jobs(env):
            subprocess.run(["scancel", job], env=env, timeout=60)
        for daemon in ("slurmd", "slurmctld", "munged"):
            pid = work / f"{daemon}.pid"
            if pid.exists():
                with_pid = int(pid.read_text().split()[0])
                try:
                    os.kill(with_pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass


def slurm_config(tmp_path: Path, name: str, replace_after: str = "10s", slurm_extra: dict | None = None, **sections):
    """examples/gpt2.yaml (with `sections` merged in) whose workers are two single-core SLURM jobs (`slurm_extra`
    more of `dask.slurm`), their logs in tmp_path/NAME-logs, its output tmp_path/NAME."""
    config = yaml.safe_load((REPO / "examples" / "gpt2.yaml").read_text())
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    config["output"]["path"] = str(tmp_path / name)
    slurm = {"jobs": 2, "cores": 1, "memory": "2GiB", "walltime": "00:10:00", "scheduler_host": "127.0.0.1",
             "replace_after": replace_after}  # fmt: skip
    slurm["environment"] = ["PATH", "HOME", "LANG", "TOKENMILL_CACHE_DIR"]  # the suite's own cache (conftest)
    places = {"log_directory": str(tmp_path / f"{name}-logs"), "shared_directory": str(tmp_path / f"{name}-tls")}
    config["dask"] = {"slurm": {**slurm, **places, **(slurm_extra or {})}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_on_slurm(config: Path, slurm, prefect_api: str, logging: str = "WARNING", **env: str) -> subprocess.Popen:
    env = {**slurm.env, "PREFECT_API_URL": prefect_api, "PREFECT_LOGGING_LEVEL": logging, **env}
    env.pop("TOKENMILL_DASK_ADDRESS", None)
    return subprocess.Popen(
        [*TOKENMILL, "run", str(config)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def submitted(logs: Path) -> set[str]:
    """The ids of the worker jobs a run submitted (dask-jobqueue names each job's log after it)."""
    return {re.sub(r"\D", "", p.stem) for p in logs.glob("*.err")}


def no_jobs_left(slurm) -> bool:
    deadline = time.monotonic() + STOP_CEILING
    while jobs(slurm.env):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def answers_http(ip: str, port: int) -> bool:
    """Whether the socket listening at ip:port answers a plain HTTP request (a dashboard; Dask's comms speak TLS)."""
    try:
        with socket.create_connection(("127.0.0.1" if ip in ("0.0.0.0", "::") else ip, port), timeout=2) as raw:
            raw.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            return raw.recv(5) == b"HTTP/"
    except OSError:
        return False


def websocket_status(ip: str, port: int, path: str, origin: str | None) -> str:
    """The status a websocket handshake at `path` gets from the dashboard at ip:port, from a page of `origin` (101:
    taken; 403: refused; 404: no such route)."""
    headers = "".join(f"{h}\r\n" for h in (*WEBSOCKET_UPGRADE, *([f"Origin: {origin}"] if origin else [])))
    try:
        with socket.create_connection((ip, port), timeout=3) as raw:
            raw.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\n{headers}\r\n".encode())
            return raw.recv(64).split(b" ", 2)[1].decode()
    except (OSError, IndexError) as e:
        return repr(e)


WEBSOCKET_UPGRADE = ("Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13",
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")  # fmt: skip


def dashboard_answers(ip: str, port: int) -> dict | None:
    """What a dashboard's websockets answer (`websocket_status`): its own page's (`localhost:<port>`) and another
    site's at /status/ws, and /eventstream's; None while its pages are not there yet (the scheduler's come a moment
    after its HTTP server)."""
    own = websocket_status(ip, port, "/status/ws", f"http://localhost:{port}")
    if own != "101":
        return None
    return {"own": own, "other": websocket_status(ip, port, "/status/ws", "http://evil.example"),
            "eventstream": websocket_status(ip, port, "/eventstream", f"http://localhost:{port}")}  # fmt: skip


def watch_listeners(run: subprocess.Popen, marker: str, seen: dict, stop: threading.Event) -> None:
    """Until `stop`: every socket the run's processes listen on (the flow's, with the scheduler; the worker jobs',
    found by `marker` in their command line, and their children), in `seen` as (ip, port) -> answers HTTP; and in
    `seen["websockets"]`, each dashboard's `dashboard_answers`."""
    answered = seen.setdefault("websockets", {})
    while not stop.is_set():
        try:
            flow = psutil.Process(run.pid)
            jobs = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or ())]
            processes = [flow, *flow.children(recursive=True)]
            processes += [q for p in jobs for q in (p, *p.children(recursive=True))]
        except psutil.Error:  # the run ended
            processes = []
        for process in processes:
            try:
                listening = [c.laddr for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
            except psutil.Error:
                continue
            for ip, port in listening:
                if (ip, port) not in seen:
                    seen[ip, port] = answers_http(ip, port)
                if seen[ip, port] and (ip, port) not in answered and (found := dashboard_answers(ip, port)):
                    answered[ip, port] = found
        stop.wait(0.3)


def test_a_run_whose_workers_are_slurm_jobs_publishes_what_a_local_cluster_run_does(
    slurm, prefect_api, gpt2_run, tmp_path
):
    """Its jobs get only the variables `dask.slurm.environment` names, from a file only this user can read: not the
    flow's credentials (Prefect's password, a planted secret), and nothing of them in the job script. The
    dashboards (the scheduler's in the flow's process, each worker's) listen on loopback only, take websockets of
    their own pages only, and have no /eventstream. The scheduler, in the flow's process on the login node, keeps its
    scratch space in a directory of the run's own: a `dask-scratch-space/global.lock` planted in the login node's
    temporary directory (Dask's fixed name, which any user can make first), linked to a file of the run's user, is
    left as it was, the file intact, and nothing of the run stays in that directory."""
    login_tmp, victim = tmp_path / "login-tmp", tmp_path / "victim"
    victim.write_bytes(b"a file of the run's user\n")
    (login_tmp / "dask-scratch-space").mkdir(parents=True)
    (login_tmp / "dask-scratch-space" / "global.lock").symlink_to(victim)
    job_logs = tmp_path / "slurm-logs"
    job_env = {
        "environment": ["PATH", "HOME", "TOKENMILL_CACHE_DIR", "TOKENMILL_NAMED"],
        "setup": [f"env > {job_logs}/env-$SLURM_JOB_ID.txt"],
    }
    config = slurm_config(tmp_path, "slurm", slurm_extra=job_env, partition={"shard_size": "1MB"})
    secret = {"TOKENMILL_NAMED": "named", "TOKENMILL_SECRET": "planted-secret"}
    run = run_on_slurm(config, slurm, prefect_api, "INFO", TMPDIR=str(login_tmp), **secret)
    seen, stop = {}, threading.Event()
    watcher = threading.Thread(target=watch_listeners, args=(run, str(tmp_path / "slurm-tls"), seen, stop))
    watcher.start()
    try:
        out = run.communicate(timeout=600)[0]
    finally:
        stop.set()
        watcher.join()
    assert run.returncode == 0, out
    websockets = seen.pop("websockets")
    dashboards = sorted(address for address, http in seen.items() if http)
    assert len(dashboards) >= 2 and all(ip == "127.0.0.1" for ip, _ in dashboards), seen
    # Each dashboard (the scheduler's and the workers') takes websockets of its own pages only; none has /eventstream
    assert len(websockets) >= 2 and all(
        answers == {"own": "101", "other": "403", "eventstream": "404"} for answers in websockets.values()
    ), websockets
    assert "Dask: SLURM jobs" in out
    # The jobs went back to the queue once the shard work was done, before publish copied in the flow's process.
    released = re.search(r"released the cluster's workers before publish: 2 SLURM jobs cancelled", out)
    published = re.search(r"published \S+ \(\d+ files copied", out)
    assert released and published and released.start() < published.start(), out
    assert dataset_files(tmp_path / "slurm") == dataset_files(gpt2_run)
    assert len(submitted(tmp_path / "slurm-logs")) >= 2  # its workers ran as jobs
    logs = " ".join(p.read_text() for p in (tmp_path / "slurm-logs").glob("*.err"))
    assert re.search(r"Start worker at: +tls://", logs) and "tcp://" not in logs  # over TLS, the run's certificates
    assert no_jobs_left(slurm)  # cancelled when the run ended
    assert not any((tmp_path / "slurm-tls").iterdir())  # the run's certificates removed, and its environment file
    assert victim.read_bytes() == b"a file of the run's user\n"
    assert [str(p.relative_to(login_tmp)) for p in login_tmp.rglob("*")] == [
        "dask-scratch-space", "dask-scratch-space/global.lock"
    ]  # fmt: skip
    dumps = [p.read_text() for p in job_logs.glob("env-*.txt")]
    assert dumps and all("TOKENMILL_NAMED=named\n" in d for d in dumps), dumps
    secrets = ("planted-secret", os.environ["PREFECT_API_AUTH_STRING"], "PREFECT_API_URL", "TOKENMILL_SECRET")
    assert not [s for s in secrets for d in dumps if s in d]
    # What slurmctld keeps of each job (its script and environment, for its administrators): none of it either
    kept = [p for p in (slurm.work / "state").rglob("*") if p.name in ("script", "environment")]
    assert kept and not [p for p in kept for s in secrets if s.encode() in p.read_bytes()], kept


def test_worker_jobs_cancelled_mid_run_are_replaced_and_the_output_is_the_same_bytes(
    slurm, prefect_api, gpt2_run, tmp_path
):
    """Both worker jobs cancelled once the first shard has committed: the run can only finish on new jobs, which
    `dask.slurm.replace_after` later take their places; its output equals a LocalCluster run's."""
    config = slurm_config(tmp_path, "cancelled", partition={"shard_size": "1MB"}, replace_after="2s")
    run = run_on_slurm(config, slurm, prefect_api)
    commits = tmp_path / "cancelled" / "_commits" / "tokenize"
    deadline = time.monotonic() + STOP_CEILING
    while not (commits.exists() and any(commits.glob("*.json"))):  # a shard committed: the jobs are at work
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
        time.sleep(0.05)
    cancelled = jobs(slurm.env)
    assert len(cancelled) == 2, cancelled
    subprocess.run(["scancel", *cancelled], env=slurm.env, check=True, timeout=60)
    out = run.communicate(timeout=600)[0]
    assert run.returncode == 0, out
    assert dataset_files(tmp_path / "cancelled") == dataset_files(gpt2_run)
    assert len(submitted(tmp_path / "cancelled-logs") - set(cancelled)) >= 1  # new jobs finished the run
    assert no_jobs_left(slurm)


@pytest.mark.slow
def test_worker_jobs_that_reach_their_walltime_are_replaced_and_the_work_completes(slurm, tmp_path, monkeypatch):
    """One worker job at a time, of SLURM's shortest walltime (a minute), and three minutes of work: each job's
    worker retires just before its walltime (`--lifetime`), the job ends, a new job takes its place, and every
    task completes, on three jobs or more. Each result is taken as it comes and let go, as the shard stages do
    (a result left on a worker that retires with no other worker to take it is lost, and its task redone)."""
    from distributed import Client, as_completed

    from flows.clusters import slurm as slurm_kind
    from tokenmill.config import DaskConfig

    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    config = DaskConfig(
        slurm={
            "jobs": 1, "cores": 1, "memory": "2GiB", "walltime": "00:01:00", "scheduler_host": "127.0.0.1",
            "replace_after": "2s", "log_directory": str(tmp_path / "logs"), "shared_directory": str(tmp_path / "tls"),
        }
    )  # fmt: skip

    def work() -> str:
        time.sleep(3)
        return os.environ["SLURM_JOB_ID"]

    job_ids = []
    with slurm_kind.start(config) as running, Client(running.address, security=running.security) as client:
        for future in as_completed([client.submit(work, pure=False) for _ in range(60)], timeout=600):
            job_ids.append(future.result())
            future.release()
    assert len(job_ids) == 60 and len(set(job_ids)) >= 3, job_ids
    assert no_jobs_left(slurm)
