"""The run's Dask workers as SLURM batch jobs (`dask.slurm`): dask-jobqueue's SLURMCluster, whose scheduler runs in
the flow's process (on a login node, or in the flow's own job) and speaks only TLS, with certificates made for the
run. Its jobs are submitted as the run starts and
kept at `jobs` (or between `dask.adaptive`'s bounds, in workers) while it runs: a job that ends (`scancel`, a node
lost, its walltime) is replaced, and its shards are retried on the others. Each worker retires a few minutes
before its job's walltime, so that a job ends between shards rather than in one. The jobs are cancelled when the
shard work is done, before publish copies the dataset (which runs in the flow's process), and at the latest when
the run ends."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import dask

from flows.clusters import (
    DASHBOARD_ROUTES,
    OWN_ORIGIN_ONLY,
    ClusterStartError,
    Running,
    attach_dashboard,
    private_scratch,
)
from flows.dask_settings import WORKER_ENVIRONMENT

if TYPE_CHECKING:
    from tokenmill.config import DaskConfig, TokenizerConfig

RETIRE_BEFORE_S = 300  # a worker retires this long before its job's walltime (a tenth of it for short jobs)
RELEASE_CEILING_S = 60  # the longest a release waits for scancel (a job not cancelled by then is at the run's end)
# The dashboards on loopback (the scheduler's on this host, each worker's on its node), unauthenticated as they are:
# reach the scheduler's through an ssh tunnel (docs/production.md). Their websockets take pages of their own address
# only: the scheduler's `attach_dashboard`, the workers' `OWN_ORIGIN_ONLY` (`localhost:<port>`).
DASHBOARD = "127.0.0.1:0"
ROLES = "flows.clusters.roles"  # a worker's certificate cannot act as a client (that module says why)
WORKER_GUARDS = ("--dashboard-address", DASHBOARD, "--preload", ROLES, "--preload-nanny", ROLES)


# Each job's Dask scratch space: a new directory of mode 0700 (mktemp's) on the node, removed as the job's script exits.
# Dask's default is a fixed name under /tmp that any user of the node can make first, and plant links in.
SCRATCH = (
    'TOKENMILL_SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/tokenmill-dask-XXXXXXXX")" && '
    "trap 'rm -rf \"$TOKENMILL_SCRATCH\"' EXIT"
)


def walltime_seconds(walltime: str) -> int:
    """SLURM's time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    days, _, clock = walltime.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:
        hours, minutes, seconds = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def run_security(certs: Path, host: str):
    """Mutual TLS for one run, from certificates made for it in `certs` (`tokenmill.commands.certs`): only its own jobs
    can join its scheduler, whose port anyone on the cluster's network could otherwise send code to."""
    from distributed.security import Security

    from tokenmill.commands.certs import make_certificates

    make_certificates(certs, [host], days=30, keep_authority_key=False)  # no key on the shared storage can sign
    role = {r: (str(certs / f"{r}.pem"), str(certs / f"{r}-key.pem")) for r in ("scheduler", "worker", "client")}
    return Security(
        tls_ca_file=str(certs / "ca.pem"), require_encryption=True,
        tls_scheduler_cert=role["scheduler"][0], tls_scheduler_key=role["scheduler"][1],
        tls_worker_cert=role["worker"][0], tls_worker_key=role["worker"][1],
        tls_client_cert=role["client"][0], tls_client_key=role["client"][1],
    )  # fmt: skip


def job_environment(directory: Path, names: list[str]) -> Path:
    """The variables named in `names` (those set here), written for the jobs to source into a file that only this
    user can read (mode 0600, in the run's 0700 directory, removed with it): sbatch stores the job script and, unless
    told --export=NONE, this whole environment in SLURM's records, which the cluster's administrators and its
    accounting read."""
    path = directory / "environment"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as f:
        f.writelines(f"{name}={shlex.quote(os.environ[name])}\n" for name in names if name in os.environ)
    return path


def chosen(dask_config: DaskConfig) -> bool:
    return dask_config.slurm is not None


def threads(dask_config: DaskConfig) -> int:
    """Its size in worker processes, which may still be queued as the run plans."""
    adaptive, slurm = dask_config.adaptive, dask_config.slurm
    return adaptive.maximum if adaptive else slurm.jobs * slurm.processes


@contextlib.contextmanager
def start(dask_config: DaskConfig, tokenizer: TokenizerConfig | None = None) -> Iterator[Running]:
    with slurm_cluster(dask_config) as (cluster, adaptive):

        def release() -> str:
            """Cancel every job now, and stop replacing them; return once each is cancelled. The Adaptive adapts on
            the cluster's loop: a call in flight as it stops can still submit jobs after the first scale(0) (seen: two
            new jobs, held until the ceiling), so each turn of the wait scales to 0 again."""
            held = len(cluster.workers)
            adaptive.stop()
            deadline = time.monotonic() + RELEASE_CEILING_S
            cluster.scale(0)
            while cluster.workers and time.monotonic() < deadline:
                time.sleep(0.1)
                cluster.scale(0)
            return f"{held} SLURM jobs cancelled" if not cluster.workers else f"{held} SLURM jobs still cancelling"

        yield Running(cluster.scheduler_address, cluster.security, release)


@contextlib.contextmanager
def slurm_cluster(dask_config: DaskConfig) -> Iterator:
    """The SLURMCluster `dask_config.slurm` describes and the Adaptive that keeps its jobs submitted; the jobs
    cancelled on exit, and the run's certificates removed."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise ClusterStartError("dask.slurm needs dask-jobqueue: pip install 'tokenmill[slurm]'") from None
    slurm, adaptive = dask_config.slurm, dask_config.adaptive
    walltime = walltime_seconds(slurm.walltime)
    lifetime = max(walltime - RETIRE_BEFORE_S, walltime * 9 // 10)
    environ = WORKER_ENVIRONMENT | OWN_ORIGIN_ONLY
    exports = [f"export {name}={shlex.quote(value)}" for name, value in environ.items()]
    host = slurm.scheduler_host or socket.gethostname()
    shared = Path(slurm.shared_directory or Path.home() / ".tokenmill" / "slurm").expanduser()
    shared.mkdir(mode=0o700, parents=True, exist_ok=True)  # the jobs read their certificate and key there
    read_only = dask.config.set({"distributed.scheduler.http.routes": DASHBOARD_ROUTES})  # its dashboard's pages
    # The scheduler runs in this process, on a login node whose temporary directory its users share: its scratch space
    # is a directory of the run's own (`private_scratch`), not Dask's fixed name there
    with (
        tempfile.TemporaryDirectory(prefix="run-", dir=shared) as certs,
        read_only,
        private_scratch() as scratch,
        dask.config.set({"temporary-directory": scratch}),
    ):
        environment = job_environment(Path(certs), slurm.environment)
        try:
            cluster = SLURMCluster(
                queue=slurm.partition,
                account=slurm.account,
                walltime=slurm.walltime,
                job_cpu=slurm.cores,
                cores=slurm.processes,  # one thread per worker process
                processes=slurm.processes,
                memory=slurm.memory,
                # -P: not the job's working directory (where it was submitted) on sys.path, as `tokenmill run`'s cluster
                python=f"{slurm.python or sys.executable} -P",
                job_extra_directives=["--export=NONE", *slurm.directives],  # none of this environment: `environment`
                job_script_prologue=[
                    f"set -a; . {shlex.quote(str(environment))}; set +a",
                    SCRATCH,
                    *exports,
                    *slurm.setup,
                ],
                local_directory='"$TOKENMILL_SCRATCH"',  # expanded by the job's shell
                worker_extra_args=[
                    *("--lifetime", f"{lifetime}s", "--lifetime-stagger", f"{min(60, lifetime // 10)}s"),
                    *WORKER_GUARDS,
                ],
                scheduler_options={  # its dashboard's pages come once its port is known (`attach_dashboard`)
                    "host": host,
                    "dashboard_address": DASHBOARD,
                    "dashboard": False,
                    "preload": [ROLES],
                },
                log_directory=slurm.log_directory,
                security=run_security(Path(certs), host),
            )
        except Exception as e:  # sbatch missing, a setting SLURM or dask-jobqueue refuses
            raise ClusterStartError(
                f"the SLURM cluster could not start ({type(e).__name__}: {e}); nothing was run"
            ) from e
        try:
            attach_dashboard(cluster)
        except Exception as e:  # the shards do not need it
            logging.getLogger(__name__).warning("the Dask dashboard did not start (%r): the run goes on without it", e)
        # How long after a job's workers are gone its place goes to a new job: tokenmill's LocalCluster waits an
        # hour (its nanny restarts a dead worker in place: flows.clusters.local_process); a SLURM job that ended
        # does not return.
        replacing = dask.config.set({"distributed.deploy.lost-worker-timeout": slurm.replace_after})
        try:
            with replacing:
                if adaptive:
                    keeping = cluster.adapt(minimum=adaptive.minimum, maximum=adaptive.maximum)
                else:  # adaptive between equal bounds: a job that ends is replaced
                    keeping = cluster.adapt(minimum_jobs=slurm.jobs, maximum_jobs=slurm.jobs)
                yield cluster, keeping
        finally:
            cluster.close()  # scancel every job it submitted
