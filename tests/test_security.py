"""Safe where it runs: on a shared host (a SLURM login node), another user of the host cannot drive a user's
local Prefect server nor read its credentials. A second Unix user is made here (`useradd`) and acts through
`runuser`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from .conftest import (
    GATED_RUN,
    REPO,
    STOP_CEILING,
    TOKENMILL,
    alive_in_session,
    api_post,
    gated_news,
    served_process,
    stop,
)

OTHER = "tokenmill-other"
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"


@pytest.fixture(scope="module")
def other_user() -> str:
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("a second user needs root, useradd and runuser")
    made = subprocess.run(["id", OTHER], capture_output=True).returncode != 0
    if made:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER], check=True)
    yield OTHER
    if made:
        subprocess.run(["userdel", OTHER], check=False)


def as_other(*command: str) -> subprocess.CompletedProcess:
    """`command` run as the other user, with an environment of its own (none of this user's settings)."""
    clean = ["env", "-i", "HOME=/tmp", "PATH=/usr/bin:/bin", "DASK_TEMPORARY_DIRECTORY=/tmp"]
    return subprocess.run(["runuser", "-u", OTHER, "--", *clean, *command], capture_output=True, text=True, timeout=120)


def status_for_other(url: str, body: str | None = "{}") -> str:
    """The HTTP status another user gets for a POST of `body` to `url` (a GET with no body): curl as that user,
    without the password."""
    post = ["-X", "POST", "-H", "content-type: application/json", "-d", body] if body is not None else []
    asked = as_other("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *post, url)
    assert asked.returncode == 0, asked.stderr
    return asked.stdout


def test_another_user_can_neither_list_nor_start_runs_on_the_local_server_nor_read_its_password(
    gpt2_run, prefect_api, other_user
):
    """After a run, against the server that stays up: the runs and their configs are listed for its user only;
    another user's request to list them, to create a flow or to start a run is refused (401), and the password
    file (0600) in a PREFECT_HOME of 0700 (its database too) cannot be read."""
    home = Path(os.environ["PREFECT_HOME"])
    auth = home / "tokenmill-server-auth"
    assert stat.S_IMODE(auth.stat().st_mode) == 0o600 and stat.S_IMODE(home.stat().st_mode) == 0o700
    listed = api_post(prefect_api, "flow_runs/filter", {})
    assert listed.status_code == 200 and listed.json()  # gpt2_run's, among others
    run = listed.json()[0]
    # Every call needs the password (a POST also a CSRF token, which only the password gets): refused
    assert status_for_other(f"{prefect_api}/csrf-token?client=other", body=None) == "401"
    assert status_for_other(f"{prefect_api}/flow_runs/{run['id']}", body=None) == "401"  # a run and its config
    refused = ("401", "403")
    assert status_for_other(f"{prefect_api}/flow_runs/filter") in refused
    assert status_for_other(f"{prefect_api}/flows/", '{"name": "planted"}') in refused
    assert status_for_other(f"{prefect_api}/flow_runs/", f'{{"flow_id": "{run["flow_id"]}"}}') in refused
    assert status_for_other(f"{prefect_api}/deployments/filter") in refused
    for path in (auth, home / "prefect.db"):
        read = as_other("cat", str(path))
        assert read.returncode != 0 and "Permission denied" in read.stderr, read


# Run by the other user, with Debian's own Python (the test's interpreter lives where only root can read): every
# port either refuses a TLS client without the run's certificate, or is the dashboard's HTTP; nothing speaks Dask
# in the clear. A refusal is told by what the server sent, not by the wording of the client's error: a port that
# answered the client's hello with TLS records (a handshake, then an alert or its close on the first read) and gave
# it no data spoke TLS and refused it.
KNOCK = """
import socket, ssl, sys

def knock(port):
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client, heard = tls.wrap_bio(incoming, outgoing), bytearray()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            def exchange():
                raw.sendall(outgoing.read())
                data = raw.recv(65536)
                heard.extend(data)
                incoming.write(data) if data else incoming.write_eof()
            while True:
                try:
                    client.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    exchange()
            client.write(bytes(8))
            while True:
                try:
                    if client.read(1):
                        return "tls-answered"
                except ssl.SSLWantReadError:
                    exchange()
    except (ssl.SSLError, OSError) as e:
        why = f"{type(e).__name__}: {e}"
    if heard[:1] in (b"\\x16", b"\\x15"):  # TLS handshake or alert records: the port spoke TLS, and gave no data
        return "tls-refused"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
            return "http" if raw.recv(5) == b"HTTP/" else f"other ({why}; heard {bytes(heard[:8])!r})"
    except OSError as e:
        return f"other ({why}; heard {bytes(heard[:8])!r}; then {e})"

for port in sys.argv[1:]:
    print(port, knock(int(port)))
"""


RUNNING = {"flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}}}
UPGRADE = ("Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13",
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")  # fmt: skip


def websocket_status_for_other(url: str, origin: str | None = None) -> str:
    """The HTTP status another user's websocket handshake at `url` gets (101: switching protocols, taken)."""
    headers = [arg for header in (*UPGRADE, *([f"Origin: {origin}"] if origin else [])) for arg in ("-H", header)]
    asked = as_other("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "3", *headers, url)
    return asked.stdout


def test_a_scheduler_with_infras_settings_serves_another_user_no_eventstream_nor_websocket(other_user, tmp_path):
    """A `dask scheduler` started with the dashboard settings infra/ gives its schedulers (compose's; Kubernetes'
    are the same: tests/test_infra_files.py), its dashboard on another port than 8787 (that port named instead):
    another user's `/eventstream` gets 404 and a websocket from another site 403; from the dashboard's own page,
    101."""
    import sys

    import yaml

    from flows.server import free_port

    from .test_infra_files import COMPOSE, ORIGINS_ENV, ROUTES_ENV, scheduler_dashboard_settings

    settings = scheduler_dashboard_settings(yaml.safe_load(COMPOSE.read_text()))["compose"]
    port = free_port()
    env = os.environ | {ROUTES_ENV: settings[ROUTES_ENV], ORIGINS_ENV: settings[ORIGINS_ENV].replace("8787", str(port))}
    env["PYTHONPATH"] = str(REPO)  # flows.clusters.dashboard_routes, as the image has it
    env["DASK_TEMPORARY_DIRECTORY"] = str(tmp_path)  # its scratch space, not /tmp/dask-scratch-space
    scheduler = subprocess.Popen(
        [str(Path(sys.executable).with_name("dask")), "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", f"127.0.0.1:{port}"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        dashboard, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
        while as_other("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{dashboard}/health").stdout != "200":
            assert scheduler.poll() is None and time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.5)
        assert websocket_status_for_other(f"{dashboard}/eventstream") == "404"
        assert websocket_status_for_other(f"{dashboard}/status/ws", "http://evil.example") == "403"
        assert websocket_status_for_other(f"{dashboard}/status/ws", dashboard) == "101"
    finally:
        os.killpg(scheduler.pid, signal.SIGTERM)
        scheduler.wait(30)


def test_during_a_run_another_user_reaches_neither_its_local_dask_cluster_nor_its_prefect_server(
    prefect_api, other_user, tmp_path
):
    """During a run: its LocalCluster speaks TLS with a key that only the run's processes hold (in memory); another
    user's client is refused at every port the cluster's process listens on, whether it speaks plain TCP or TLS
    with a certificate of its own. The Prefect server refuses that user the running flow run, the list of runs
    and a new one; its password file cannot be read. The run goes on: its shards wait at a gate (`Gate`) until
    the test stops it."""
    with contextlib.ExitStack() as stack:
        gate = stack.enter_context(gated_news(tmp_path))
        env = {k: v for k, v in os.environ.items() if k != "TOKENMILL_DASK_ADDRESS"} | {"PREFECT_API_URL": prefect_api}
        log = tmp_path / "run.log"
        run = served_process(
            [*TOKENMILL, "run", "examples/gpt2.yaml", "--set", f"output.path={tmp_path / 'out'}",
             "--set", f"input.paths=[{gate.url}]", *GATED_RUN], gate.env(env), log,
        )  # fmt: skip
        stack.callback(stopped, run, log)
        gate.reached(run)
        knock_while_held(run, prefect_api)


def stopped(run: subprocess.Popen, log: Path) -> None:
    """Ctrl-C to the run's session: the run ends (`stop`) and every process of its session with it, within
    STOP_CEILING s; a process left behind prints every thread's stack into the run's log, which the failure shows."""
    stop(run, signal.SIGINT, log)
    deadline = time.monotonic() + STOP_CEILING
    while (left := alive_in_session(run.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        named = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left]
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGABRT)  # the fault handler (PYTHONFAULTHANDLER) prints its stacks
        time.sleep(2)
        raise AssertionError(f"still running {STOP_CEILING} s after the run's end: {named}\n{log.read_text()[-6000:]}")


def listening_ports(process: psutil.Process) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return sorted({c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN})
    return []  # a process that ended meanwhile


def cluster_ports(run: subprocess.Popen) -> dict[int, str]:
    """The ports the run's LocalCluster listens on: those of its own process (the scheduler, the nannies, the
    dashboard) as "cluster", its workers' as "worker"."""
    cluster = [p for p in psutil.Process(run.pid).children(recursive=True)
               if "serve_local_cluster" in " ".join(p.cmdline())]  # fmt: skip
    assert len(cluster) == 1, cluster
    ports = dict.fromkeys(listening_ports(cluster[0]), "cluster")
    for worker in cluster[0].children(recursive=True):
        ports |= dict.fromkeys(listening_ports(worker), "worker")
    return ports


def knock_while_held(run: subprocess.Popen, prefect_api: str) -> None:
    """Another user's knocks on the held run's cluster and on the Prefect server; the run still going after."""
    ports = cluster_ports(run)
    deadline = time.monotonic() + 120
    knocked = as_other(SYSTEM_PYTHON, "-c", KNOCK, *map(str, ports))
    assert knocked.returncode == 0, knocked.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in knocked.stdout.splitlines())
    assert sorted(said) == sorted(map(str, ports)), knocked.stdout
    assert set(said.values()) == {"tls-refused", "http"}, said
    http = [ports[int(port)] for port, what in said.items() if what == "http"]
    # The dashboard, and each worker's own HTTP server (Dask's Prometheus metrics and health check, which every
    # worker serves: no setting turns it off): pages to read, not a way to send work
    assert http.count("cluster") == 1 and http.count("worker") == 2, (said, ports)
    # The dashboard: read-only pages; no `/eventstream` (its websocket added a plugin to the scheduler for anyone),
    # and its own websockets refuse a page of another origin
    port = next(port for port, what in said.items() if what == "http" and ports[int(port)] == "cluster")
    dashboard = f"http://127.0.0.1:{port}"
    assert websocket_status_for_other(f"{dashboard}/eventstream") == "404"
    assert websocket_status_for_other(f"{dashboard}/status/ws", "http://evil.example") == "403"
    assert websocket_status_for_other(f"{dashboard}/status/ws", dashboard) == "101"  # so the route is there

    while not (running := api_post(prefect_api, "flow_runs/filter", RUNNING).json()):
        assert run.poll() is None and time.monotonic() < deadline, "the run ended before its flow run was seen"
        time.sleep(0.2)
    assert status_for_other(f"{prefect_api}/flow_runs/{running[0]['id']}", body=None) == "401"
    assert status_for_other(f"{prefect_api}/flow_runs/filter", json.dumps(RUNNING)) in ("401", "403")
    assert status_for_other(f"{prefect_api}/flow_runs/", f'{{"flow_id": "{running[0]["flow_id"]}"}}') in (
        "401",
        "403",
    )
    read = as_other("cat", str(Path(os.environ["PREFECT_HOME"]) / "tokenmill-server-auth"))
    assert read.returncode != 0 and "Permission denied" in read.stderr, read
    assert run.poll() is None  # the run went on meanwhile


def test_a_plain_tcp_scheduler_is_refused_unless_allowed(run_cli, tmp_path, caplog, monkeypatch):
    """`tcp://` carries the shards' traffic unencrypted and lets whoever reaches the scheduler send it code: on
    another host anyone on the network between, on loopback every user of the host. The run stops before any work,
    saying how to get certificates; `dask.allow_plaintext: true` (or TOKENMILL_DASK_ALLOW_PLAINTEXT=1, as this
    suite's own tcp:// cluster has) takes it, and the log says so."""
    from flows.clusters import ClusterStartError, external
    from tokenmill.config import DaskConfig

    monkeypatch.delenv("TOKENMILL_DASK_ALLOW_PLAINTEXT", raising=False)
    refused = run_cli("run", "examples/gpt2.yaml", "--set", f"output.path={tmp_path / 'out'}",
                      "--set", "dask.address=tcp://192.0.2.1:8786", check=False)  # fmt: skip
    said = refused.stdout + refused.stderr
    assert refused.returncode == 1 and "Traceback" not in said, said
    assert "plain TCP on another host (192.0.2.1)" in said and "tokenmill certs" in said, said
    assert not (tmp_path / "out" / "_commits").exists()
    with pytest.raises(ClusterStartError, match="plain TCP on this host's loopback, which every user of the host"):
        with external.start(DaskConfig(address="tcp://127.0.0.1:8786")):
            pass
    with caplog.at_level("WARNING"), external.start(DaskConfig(address="tcp://192.0.2.1:8786", allow_plaintext=True)):
        assert "reached over plain TCP, unencrypted and unauthenticated" in caplog.text
    monkeypatch.setenv("TOKENMILL_DASK_ALLOW_PLAINTEXT", "1")
    with external.start(DaskConfig(address="tcp://127.0.0.1:8786")) as running:
        assert running.address == "tcp://127.0.0.1:8786"


def test_a_rerun_takes_no_cluster_endpoint_or_token_from_the_output_location(gpt2_run, run_cli, tmp_path):
    """Whoever can write the output location could plant a cluster in the run config stored there (SLURM jobs whose
    `setup` lines run as you; `dask.address` of their own scheduler, whose results the flow unpickles), endpoints that
    get your S3 credentials, or a hub token variable: a rerun refuses a config not signed with its user's key; one
    signed, it takes none of them, says what it took from there, and runs as the stored config says otherwise."""
    from tokenmill.commands.runs import load_run_config
    from tokenmill.config import DaskConfig, HubConfig, StorageConfig
    from tokenmill.core.signing import write_signed
    from tokenmill.io.storage import Store

    out, ran = tmp_path / "out", tmp_path / "planted-setup-ran"
    shutil.copytree(gpt2_run, out)
    stored = json.loads((out / "_work/config.json").read_text())
    stored["dask"] = {"slurm": {"setup": [f"touch {ran}"], "jobs": 1}}
    planted = {"endpoint_url": "http://planted.invalid", "profile": "theirs"}
    stored["input"]["storage"] = stored["output"]["storage"] = stored["output"]["publish"]["storage"] = planted
    stored["tokenizer"]["hub"]["token_env"] = "AWS_SECRET_ACCESS_KEY"
    (out / "_work/config.json").write_text(json.dumps(stored))
    # Not signed with the user's key (tokenmill.core.signing): refused, naming the file, before anything runs
    refused = run_cli("rerun", str(out), "--shard", "1", check=False)
    assert refused.returncode == 1 and not ran.exists(), refused.stdout
    assert f"{out}/_work/config.json is not signed with your tokenmill key" in refused.stdout, refused.stdout

    # One the user's key signed (their own edit, an older run's) still gives no cluster, endpoint or token variable
    write_signed(Store(out), "_work/config.json", (out / "_work/config.json").read_bytes())
    config, taken = load_run_config(str(out))
    assert config.dask == DaskConfig()  # a LocalCluster, or the one $TOKENMILL_DASK_ADDRESS names
    assert config.input.storage == config.output.storage == config.output.publish.storage == StorageConfig()
    assert config.tokenizer.hub.token_env == HubConfig().token_env and "dask" not in taken and "input" in taken
    result = run_cli("rerun", str(out), "--shard", "1")
    assert f"from {out}/_work/config.json: " in result.stdout, result.stdout
    assert "; the cluster: " in result.stdout and "planted" not in result.stdout, result.stdout
    assert not ran.exists()
    assert json.loads((out / "_commits/tokenize/shard-00001.json").read_text())["result"]["shard_id"] == 1


def test_a_rerun_given_its_config_takes_nothing_from_the_output_location_and_refuses_another_dataset(
    gpt2_run, run_cli, tmp_path
):
    """With --config (as the rerun deployments of `tokenmill serve` and prefect.yaml have), the stored config only
    checks that the config given defines the dataset in the output: one planted with other inputs is refused."""
    from tokenmill.commands.runs import load_run_config
    from tokenmill.config import load_config

    out, secret = tmp_path / "out", tmp_path / "secret.jsonl"
    shutil.copytree(gpt2_run, out)
    secret.write_text(json.dumps({"text": "a secret of whoever reruns"}) + "\n")
    given = tmp_path / "given.yaml"  # examples/gpt2.yaml as gpt2_run ran it
    given.write_text((REPO / "examples/gpt2.yaml").read_text().replace("shard_size: 64MB", "shard_size: 1MB"))
    stored = json.loads((out / "_work/config.json").read_text())
    stored["input"]["paths"] = [str(secret)]  # planted
    (out / "_work/config.json").write_text(json.dumps(stored))

    refused = run_cli("rerun", str(out), "--config", str(given), "--shard", "1", check=False)
    assert refused.returncode == 1 and "defines another dataset than the run there: input" in refused.stdout

    shutil.copy(gpt2_run / "_work/config.json", out / "_work/config.json")
    # What a rerun never takes from there is not the dataset: the given config's own values are no difference
    own = load_config(given, ["tokenizer.hub.token_env=MY_HF_TOKEN", "output.storage.endpoint_url=http://mine"])
    config = load_run_config(str(out), own)[0]
    assert (config.tokenizer.hub.token_env, config.output.storage.endpoint_url) == ("MY_HF_TOKEN", "http://mine")
    result = run_cli("rerun", str(out), "--config", str(given), "--shard", "1")
    assert "from the config given (it defines the dataset in" in result.stdout, result.stdout
    assert "4 shards (3 reused)" in result.stdout


def test_a_plan_planted_with_the_right_key_and_other_files_is_not_read(gpt2_run, run_cli, tmp_path):
    """plan.json names the files each shard reads. One rewritten by a writer of the output location, keeping the
    key the rerun computes (the input config's hash and the input files' fingerprints, all readable there) but a
    shard's piece pointing at a file of whoever reruns, is replaced by the plan the rerun makes: the shard's output
    is the one the real input makes."""
    out, secret = tmp_path / "out", tmp_path / "secret.jsonl"
    shutil.copytree(gpt2_run, out)
    secret.write_text(json.dumps({"text": "a secret of whoever reruns"}) + "\n")
    honest = json.loads((out / "plan.json").read_text())
    planted = json.loads(json.dumps(honest))
    shard = planted["shards"][1]
    shard["pieces"] = [{**shard["pieces"][0], "path": str(secret), "start": 0, "end": None, "first_line": 1}]
    (out / "plan.json").write_text(json.dumps(planted))
    before = {p: p.read_bytes() for p in (out / "megatron").rglob("shard-00001.*")}

    run_cli("rerun", str(out), "--shard", "1")
    assert json.loads((out / "plan.json").read_text()) == honest
    assert {p: p.read_bytes() for p in (out / "megatron").rglob("shard-00001.*")} == before != {}


def test_certificates_carry_only_the_usage_their_role_needs_and_a_runs_own_have_no_authority_key(tmp_path):
    """The client's certificate cannot serve (client authentication only); the scheduler's and the workers' both
    serve and connect. A run's own certificates (SLURM: on storage the nodes share) are written without the
    authority's key, so nothing there can sign another certificate; `tokenmill certs` keeps it for its user."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    from tokenmill.commands.certs import make_certificates

    def usages(path: Path) -> set:
        certificate = x509.load_pem_x509_certificate(path.read_bytes())
        return set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)

    written = make_certificates(tmp_path / "run", ["node1"], days=1, keep_authority_key=False)
    assert not (tmp_path / "run" / "ca-key.pem").exists() and all(p.exists() for p in written)
    assert usages(tmp_path / "run" / "client.pem") == {ExtendedKeyUsageOID.CLIENT_AUTH}
    both = {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH}
    assert usages(tmp_path / "run" / "scheduler.pem") == usages(tmp_path / "run" / "worker.pem") == both
    kept = make_certificates(tmp_path / "kept", ["node1"], days=1)
    key = tmp_path / "kept" / "ca-key.pem"
    assert key in kept and stat.S_IMODE(key.stat().st_mode) == 0o600


def test_serve_refuses_a_config_holding_secrets_which_its_deployments_would_hold_masked(run_cli):
    """A deployment's parameters are recorded as tokenmill records a config: secrets masked. Served with one, its
    runs would send the mask as a key; `tokenmill serve` says where the secret is and where to give it instead."""
    result = run_cli(
        "serve", "examples/gpt2.yaml", "--set", "output.storage.secret=planted", "--set", "input.storage.key=k",
        check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout
    assert "input.storage.key, output.storage.secret: a deployment's parameters are stored with secrets masked" in (
        result.stdout
    )
    assert "planted" not in result.stdout and "AWS_SECRET_ACCESS_KEY" in result.stdout


def test_prefects_sdk_sends_no_usage_events_from_tokenmills_processes():
    """Prefect's SDK sends usage events to its analytics service from an interactive terminal unless DO_NOT_TRACK is
    set (or a CI's variables are): tokenmill's processes set it (`flows/__init__.py`), as the server tokenmill
    starts has its analytics off. Prefect imported alone would send them; a user's own DO_NOT_TRACK stays."""
    from prefect._internal.analytics.ci_detection import CI_ENV_VARS

    probe = "import {}; from prefect._internal.analytics import is_telemetry_enabled as on; print(on())"
    env = {k: v for k, v in os.environ.items() if k not in CI_ENV_VARS and k != "DO_NOT_TRACK"}

    def telemetry(module: str, **more: str) -> str:
        run = subprocess.run([sys.executable, "-c", probe.format(module)], env=env | more, capture_output=True,
                             text=True, check=True)  # fmt: skip
        return run.stdout.strip()

    assert telemetry("flows.cli") == "False"
    assert telemetry("prefect") == "True"
    assert telemetry("flows.cli", DO_NOT_TRACK="0") == "True"
