"""Shared fixtures. Integration tests run the real thing: a `prefect server` started here on 127.0.0.1
(stopped at the end), the `tokenmill` CLI in a process of its own (`tests/prewarmed.py`), and a real Dask
cluster."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from flows.server import free_port

from .prewarmed import Forked, Interpreters, fresh

REPO = Path(__file__).resolve().parents[1]
# The real tokenizers, corpora and conversations the tests read: small slices in the repository, each folder with
# its SOURCE.md and license (tests/data/build.py made them).
DATA = REPO / "tests" / "data"
TOKENIZERS = DATA / "tokenizers"
CORPORA = DATA / "corpora"
CHAT = DATA / "chat"
EXAMPLES = REPO / "examples"
TOKENMILL = [str(Path(sys.executable).with_name("tokenmill"))]  # the installed command, as a user runs it


def maintainers_file(path: str) -> Path:
    """A file of the maintainers' store beside the repository (../shared), for the few tests of a file whose license
    keeps it out of the repository; where it is absent the test is skipped, saying so."""
    file = REPO.parent / "shared" / path
    if not file.is_file():
        pytest.skip(f"needs ../shared/{path}, which its license keeps out of the repository (tests/data/build.py)")
    return file


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# What a suite writes to the temp dir (its runs' outputs, about 2.5 GiB), with room to spare
SUITE_TEMP_BYTES = 4 << 30


def pytest_configure(config):
    """Refuse to start where the suite would fill the disk: a full disk fails its last tests far from the cause (runs
    that cannot write their shards, servers that stop answering), slowly, each at its own timeout."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller has looked
        return
    temp = tempfile.gettempdir()
    if (free := shutil.disk_usage(temp).free) < SUITE_TEMP_BYTES:
        pytest.exit(
            f"{temp}: {free / 2**30:.1f} GiB free, and the suite writes about 2.5 GiB there: free some space (earlier "
            "suites' pytest-of-* directories, other clones' venvs) and run it again",
            returncode=1,
        )


@pytest.fixture(scope="session", autouse=True)
def tokenmill_cache(tmp_path_factory) -> Path:
    """tokenmill's cache (encoder choices, code-point probes, converted tokenizers) for this suite alone, empty at its
    start and shared by its processes: what a test sees must not depend on what earlier runs on this machine, of this
    code or older, left in ~/.cache/tokenmill (a choice kept by older code once changed five tests' manifests)."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tokenmill-cache"
    os.environ["TOKENMILL_CACHE_DIR"] = str(cache)
    # OLMo-core (the trainers' tests) makes a triton cache under /tmp/olmo-triton-cache as it is imported, one a
    # process, and leaves it: the suite's goes with the suite's temporary directory instead
    os.environ.setdefault("OLMO_TRITON_CACHE_BASE", str(base / "olmo-triton-cache"))
    return cache


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory) -> str:
    """A real Prefect server on 127.0.0.1 with its own PREFECT_HOME, for the whole session."""
    from flows import server

    home = tmp_path_factory.mktemp("prefect-home")
    saved = {k: os.environ.get(k) for k in ("PREFECT_HOME", "PREFECT_API_URL", "PREFECT_API_AUTH_STRING")}
    os.environ["PREFECT_HOME"] = str(home)
    os.environ.pop("PREFECT_API_URL", None)
    os.environ["PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS"] = "2"  # cron runs appear within seconds
    # and the served deployments and work-pool workers the tests start look for them every second, not every 10 s
    os.environ["PREFECT_RUNNER_POLL_FREQUENCY"] = "1"
    os.environ["PREFECT_WORKER_QUERY_SECONDS"] = "1"
    state = server.start_server()
    os.environ["PREFECT_API_AUTH_STRING"] = server.server_auth()  # what its user's processes send
    yield state["api_url"]
    server.stop_server()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def prefect_client(prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    settings = {PREFECT_API_URL: prefect_api, PREFECT_API_AUTH_STRING: os.environ["PREFECT_API_AUTH_STRING"]}
    with temporary_settings(settings), get_client(sync_client=True) as client:
        yield client


def api_auth() -> tuple[str, str]:
    """The session server's user and password, for a test's own HTTP calls to its API."""
    user, password = os.environ["PREFECT_API_AUTH_STRING"].split(":", 1)
    return user, password


def api_post(api: str, path: str, body: dict):
    """A POST to the session server's API as its user would make it: with the password, and the CSRF token the
    server hands that user (it refuses a POST without one)."""
    import httpx

    token = httpx.get(f"{api}/csrf-token", params={"client": "tests"}, auth=api_auth(), timeout=30).json()["token"]
    headers = {"Prefect-Csrf-Token": token, "Prefect-Csrf-Client": "tests"}
    return httpx.post(f"{api}/{path}", json=body, auth=api_auth(), headers=headers, timeout=30)


@pytest.fixture(scope="session")
def dask_cluster(s3_server, tmp_path_factory):
    """A real Dask cluster for the session: `dask scheduler` and two `dask worker` processes on 127.0.0.1,
    kept warm across runs as a team's shared cluster is (runs with a LocalCluster ask for one). Its workers
    hold the S3 server's credentials in their environment, as a cluster's nodes would."""
    from distributed import Client

    from flows.dask_settings import WORKER_ENVIRONMENT  # what tokenmill's own workers have, as infra/ sets it

    bin_dir, port = Path(sys.executable).parent, free_port()
    address = f"tcp://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
    loopback = ["--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0"]
    # Their scratch space (dask-scratch-space, left behind as they are killed) in the suite's temporary directory
    env = os.environ | {"DASK_TEMPORARY_DIRECTORY": str(tmp_path_factory.mktemp("dask-cluster"))}
    worker = [bin_dir / "dask", "worker", address, "--nthreads", "1", "--memory-limit", "4GiB", *loopback]
    processes = [subprocess.Popen([bin_dir / "dask", "scheduler", "--port", str(port), *loopback], env=env, **quiet)]
    processes += [subprocess.Popen(worker, cwd=REPO, env=env | WORKER_ENVIRONMENT, **quiet) for _ in range(2)]
    with Client(address, timeout=120) as client:
        client.wait_for_workers(2, timeout=120)
    os.environ["TOKENMILL_DASK_ALLOW_PLAINTEXT"] = "1"  # tcp:// on loopback, refused unless allowed (docs/security.md)
    yield address
    for process in reversed(processes):
        os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:  # a worker's nanny may need a second signal
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


@pytest.fixture(scope="session")
def interpreters(tmp_path_factory):
    """This test process's interpreters that fork `run_cli`'s commands (`tests/prewarmed.py`)."""
    started = Interpreters(tmp_path_factory.mktemp("interpreters"))
    yield started
    started.close()


@pytest.fixture(scope="session")
def run_cli(prefect_api, dask_cluster, interpreters):
    """Run `tokenmill ...` as a user would, against the session's Prefect server and Dask cluster
    (`local_cluster=True`: the config's own `dask:` section, a LocalCluster by default), logging warnings only
    unless `log_level` says otherwise (a user's runs log at INFO, which the UI's Logs tab shows)."""

    def run(
        *args: str, check: bool = True, local_cluster: bool = False, log_level: str = "WARNING", cwd: Path = REPO
    ) -> subprocess.CompletedProcess:
        env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_LOGGING_LEVEL": log_level}
        if not local_cluster:
            env["TOKENMILL_DASK_ADDRESS"] = dask_cluster
        started = time.monotonic()
        result = run_or_show_stacks([*TOKENMILL, *args], env, cwd, start=interpreters.start)
        if check and result.returncode != 0:
            raise AssertionError(
                f"tokenmill {' '.join(args)} exited {result.returncode} after {time.monotonic() - started:.0f} s:\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    return run


# A test's `tokenmill` command still running after this is stuck: the slowest tests that run them, several
# commands each, take under a minute beside the rest of the suite.
RUN_TIMEOUT_S = 300


def run_or_show_stacks(
    command: list, env: dict, cwd: Path = REPO, start: Callable[[list, dict, Path], subprocess.Popen | Forked] = fresh
) -> subprocess.CompletedProcess:
    """`command` run to its end (in `cwd`; `start` a fresh process or `Interpreters.start`); one still running after
    RUN_TIMEOUT_S fails the test with what it printed and every thread's stack (`tokenmill` prints them on SIGUSR1),
    then is killed."""
    process = start(command, env, cwd)
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR1)
        time.sleep(2)
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(map(str, command))} still ran after {RUN_TIMEOUT_S} s:\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.fixture(scope="session")
def gpt2_run(run_cli, tmp_path_factory) -> Path:
    """examples/gpt2.yaml in four shards, run once for the tests that read it (copy it before changing it)."""
    out = tmp_path_factory.mktemp("gpt2-run") / "out"
    result = run_cli("run", "examples/gpt2.yaml", "--set", f"output.path={out}", "--set", "partition.shard_size=1MB")
    (out.parent / "stdout.txt").write_text(result.stdout)  # what the person who ran it saw (the UI test opens its link)
    return out


def dataset_files(root: Path) -> dict[str, bytes]:
    """The published files of a dataset (those its manifest lists, and the manifest)."""
    manifest = json.loads((root / "manifest.json").read_text())
    files = {f["path"]: (root / f["path"]).read_bytes() for f in manifest["files"]}
    files["manifest.json"] = (root / "manifest.json").read_bytes()
    return files


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-protocol server on 127.0.0.1 (moto's server mode), with the standard AWS environment."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


CORPUS = EXAMPLES / "data" / "web_scrapinghub_aeb.jsonl.gz"


@pytest.fixture
def gpt2_info():
    """Install the GPT-2 tokenizer into a config's output and return its TokenizerInfo."""
    from tokenmill.stages.train_tokenizer import install_pretrained

    def install(config):
        config.tokenizer.path = str(TOKENIZERS / "gpt2" / "tokenizer.json")
        config.tokenizer.train = None
        return install_pretrained(config)

    return install


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing browser test (one using the `ui` fixture) gets a screenshot of the page as it failed, and the
    paths of every screenshot it took, under its message."""
    report = (yield).get_result()
    ui = item.funcargs.get("ui") if hasattr(item, "funcargs") else None
    if ui is not None and report.failed and call.when == "call":
        ui.shot("at-failure")
        report.sections.append(("screenshots", "\n".join(ui.paths)))


STOP_CEILING = 180  # seconds: a loaded machine took a `tokenmill serve` over 30 s to exit after Ctrl-C


def as_a_terminal_job() -> None:
    """A child's Ctrl-C as a terminal's foreground job has it (`preexec_fn`): a suite started in the background (`make
    test &`, nohup, a CI runner's script) passes SIGINT on ignored, and a Python process that starts with it ignored
    never raises KeyboardInterrupt (a held run then ignored the test's Ctrl-C until the test gave up)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def served_process(command: list[str], env: dict, log: Path, cwd: Path = REPO) -> subprocess.Popen:
    """A long-running command (`tokenmill serve`, a Prefect worker, a held run) in a session of its own as a
    terminal's job (started in `cwd`), its output in `log` and Python's fault handler on, so that `stop` can show
    where it was stuck."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            command, cwd=cwd, env={**env, "PYTHONFAULTHANDLER": "1"}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=as_a_terminal_job,
        )  # fmt: skip


def a_project_of_its_own(root: Path) -> Path:
    """A directory as a Prefect project has it, with `flows/` and `tasks/` packages of its own (which raise on import),
    to start tokenmill in: what it runs must be tokenmill's flows and tasks."""
    for package in ("flows", "tasks"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(f"raise ImportError('the project imported its own {package}')\n")
    return root


def stop(process: subprocess.Popen, sig: int = signal.SIGINT, log: Path | None = None) -> int:
    """Send `sig` to the session of a process started with `start_new_session=True` (SIGINT: as Ctrl-C in its
    terminal) and return its exit code once it has exited, within STOP_CEILING s however loaded the machine.
    Past that, SIGABRT makes the fault handler print every thread's stack into its `log` (`served_process`), its
    session is killed, and the test fails showing the log's end."""
    os.killpg(process.pid, sig)
    try:
        return process.wait(STOP_CEILING)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGABRT)
            time.sleep(2)
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        tail = log.read_text(errors="replace")[-6000:] if log else ""
        raise AssertionError(
            f"{' '.join(map(str, process.args[:4]))} still ran {STOP_CEILING} s after {sig!r}:\n{tail}"
        ) from None


GATE_PLUGIN = REPO / "tests" / "gate"  # the gated:// filesystem (gated_fs.py), which fsspec finds on PYTHONPATH
GATED_RUN = ["--set", "fertility.enabled=false", "--set", "tokenizer.verify_documents=0"]  # tokenize reads it first


class Gate:
    """An input file at which a run's tokenize stage waits until the test opens the gate: a test that needs a run
    still going (its cluster up, its shards being tokenized) holds it there, however loaded the machine, instead of
    counting on the run's length. The run reads it as `url` (tests/gate/gated_fs.py: a read from its start waits while
    `<path>.gate` exists, saying so in `<path>.waiting`), with `env(...)` and GATED_RUN's settings (no sample or
    fertility report reads the input before the shards do). It is made closed; `open`, or leaving a `with`, opens
    it."""

    def __init__(self, path: Path):
        self.path, self.gate = path, path.with_name(f"{path.name}.gate")
        self.waiting = path.with_name(f"{path.name}.waiting")
        self.gate.touch()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc) -> None:
        self.open()

    @property
    def url(self) -> str:
        return f"gated://{self.path}"

    @staticmethod
    def env(env: dict) -> dict:
        return env | {"PYTHONPATH": os.pathsep.join(filter(None, [str(GATE_PLUGIN), env.get("PYTHONPATH")]))}

    def reached(self, run: subprocess.Popen, timeout: float = 180) -> None:
        """Wait until the run's shards wait at the gate (the run failing meanwhile fails the test)."""
        deadline = time.monotonic() + timeout
        while not self.waiting.exists():
            assert run.poll() is None, f"the run ended before it reached the gate: {run.args}"
            assert time.monotonic() < deadline, f"the run did not reach the gate in {timeout} s"
            time.sleep(0.2)

    def open(self) -> None:
        self.gate.unlink(missing_ok=True)


def gated_news(folder: Path) -> Gate:
    """A gate on the bundled news sample (examples/data: 181 articles, 0.9 MB), as one plain JSONL file."""
    path = folder / "news.jsonl"
    path.write_bytes(gzip.decompress((EXAMPLES / "data" / "web_scrapinghub_aeb.jsonl.gz").read_bytes()))
    return Gate(path)


def alive_in_session(session: int) -> list[psutil.Process]:
    """The processes of a session (a command started with `start_new_session=True`: its pid) still running."""
    alive = []
    for process in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getsid(process.pid) == session and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive
