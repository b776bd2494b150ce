"""`tokenmill server`: the local Prefect server that runs naming no PREFECT_API_URL use, its UI on any port."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import httpx
import psutil

from .conftest import REPO, TOKENMILL, run_or_show_stacks


def tokenmill_server(command: str, env: dict) -> list[str]:
    done = subprocess.run([*TOKENMILL, "server", command], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_server_start_serves_a_ui_that_talks_to_its_own_port_and_stop_ends_every_process(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "PREFECT_UI_", "PREFECT_SERVER_UI"))
    }
    env["PREFECT_HOME"] = str(tmp_path / "home")
    started = tokenmill_server("start", env)
    ui, api = started[0].removeprefix("Prefect UI: "), started[1].removeprefix("PREFECT_API_URL=")
    assert ui.startswith("http://127.0.0.1:") and ui != "http://127.0.0.1:4200" and api == f"{ui}/api", started
    state = json.loads((tmp_path / "home" / "tokenmill-server.json").read_text())
    group = [p for p in psutil.process_iter() if _group_of(p) == os.getpgid(state["pid"])]
    try:
        # the browser's UI asks /ui-settings where the API is: this server's own port, not Prefect's default 4200
        assert httpx.get(f"{ui}/ui-settings", timeout=10).json()["api_url"] == api
        assert "<html" in httpx.get(f"{ui}/runs", timeout=10, headers={"accept": "text/html"}).text.lower()
        # its API answers its own user only: the password made for it, in a file only that user can read
        auth = tmp_path / "home" / "tokenmill-server-auth"
        assert stat.S_IMODE(auth.stat().st_mode) == 0o600 and stat.S_IMODE(auth.parent.stat().st_mode) == 0o700
        assert started[2].startswith(f'PREFECT_API_AUTH_STRING="$(cat {auth})"'), started
        csrf = f"{api}/csrf-token?client=tests"  # what a client asks first (a POST without its token is refused)
        assert httpx.get(csrf, timeout=10).status_code == 401
        user, password = auth.read_text().strip().split(":", 1)
        assert httpx.get(csrf, auth=(user, password), timeout=10).status_code == 200
        assert tokenmill_server("status", env)[:2] == started[:2]
        assert tokenmill_server("start", env)[:2] == started[:2]  # found, not started twice
    finally:
        stopped = tokenmill_server("stop", env)
    assert stopped == ["stopped"]
    assert not [p for p in group if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # the whole group ended
    assert tokenmill_server("status", env)[0].startswith("not running")
    assert tokenmill_server("stop", env) == ["no tokenmill-started server is running"]


def test_a_prefect_server_behind_basic_auth_takes_runs_that_have_its_password_and_says_why_it_refuses_others(
    tmp_path,
):
    """infra/ starts the Prefect server with PREFECT_SERVER_API_AUTH_STRING and gives its clients
    PREFECT_API_AUTH_STRING: a `tokenmill run` with the password reports to it; one without is refused (401) and
    told what to set, before any work; /api/health answers without a password (the probes')."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "PREFECT_UI_", "PREFECT_SERVER_UI"))
    }
    env |= {"PREFECT_HOME": str(tmp_path / "home"), "PREFECT_SERVER_API_AUTH_STRING": "tokenmill:s3cret"}
    api = tokenmill_server("start", env)[1].removeprefix("PREFECT_API_URL=")
    client = {k: v for k, v in env.items() if k != "PREFECT_SERVER_API_AUTH_STRING"} | {"PREFECT_API_URL": api}
    client.pop("TOKENMILL_DASK_ADDRESS", None)

    def run(name: str, **extra: str) -> subprocess.CompletedProcess:
        output = f"output.path={tmp_path / name}"
        return run_or_show_stacks([*TOKENMILL, "run", "examples/gpt2.yaml", "--set", output],
                                  client | extra)  # fmt: skip

    try:
        assert httpx.get(f"{api}/health", timeout=10).status_code == 200
        assert httpx.get(f"{api}/csrf-token?client=tests", timeout=10).status_code == 401
        refused = run("without")
        said = refused.stdout + refused.stderr
        assert refused.returncode == 1 and "Traceback" not in said, said
        assert f"the Prefect API at {api} asks for a user and password" in said and "PREFECT_API_AUTH_STRING" in said
        assert not (tmp_path / "without" / "demo-gpt2").exists()
        taken = run("with", PREFECT_API_AUTH_STRING="tokenmill:s3cret")
        assert taken.returncode == 0, taken.stdout + taken.stderr
        assert (tmp_path / "with" / "manifest.json").exists()
    finally:
        tokenmill_server("stop", env)


def _group_of(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except OSError:
        return None


LATE_SERVER = """
import http.server, threading, time

import flows.main  # what every entry point imports; nothing else here asks for the retries
from prefect.client.base import PrefectHttpxSyncClient
from flows.server import free_port

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"true")

port = free_port()

def serve_later():
    time.sleep(1)
    with http.server.HTTPServer(("127.0.0.1", port), Health) as server:
        server.handle_request()

threading.Thread(target=serve_later, daemon=True).start()
with PrefectHttpxSyncClient(base_url=f"http://127.0.0.1:{port}") as client:
    print(client.get("/api/health").text)
"""


def test_a_prefect_client_made_while_the_server_is_down_waits_for_it_to_come_back():
    """Prefect's client retries a refused connection only once it has connected; a run's client made while its
    server restarts (the CLI's flow run is created before the flow's body runs) would fail the run at once. In a
    fresh process that imports the flow's module, a client's first call waits for a server that comes up 1 s
    later."""
    done = subprocess.run(
        [sys.executable, "-c", LATE_SERVER], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "true"
