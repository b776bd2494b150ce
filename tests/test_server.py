"""`tokenmill server`: the local Prefect server that runs naming no PREFECT_API_URL use, its UI on any port."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import psutil

from .conftest import REPO


def tokenmill_server(command: str, env: dict) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "tokenmill", "server", command], cwd=REPO, env=env,
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
        assert tokenmill_server("status", env)[:2] == started[:2]
        assert tokenmill_server("start", env)[:2] == started[:2]  # found, not started twice
    finally:
        stopped = tokenmill_server("stop", env)
    assert stopped == ["stopped"]
    assert not [p for p in group if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # the whole group ended
    assert tokenmill_server("status", env)[0].startswith("not running")
    assert tokenmill_server("stop", env) == ["no tokenmill-started server is running"]


def _group_of(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except OSError:
        return None
