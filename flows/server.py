"""A local `prefect server` on 127.0.0.1 for runs that name no PREFECT_API_URL.

Prefect's implicit ephemeral mode starts a temporary server per process, so each Dask worker would
start its own on the same SQLite file. tokenmill instead starts one real server (or reuses the one it
started before), records it in `$PREFECT_HOME/tokenmill-server.json` and exports its URL, which the
Dask workers inherit. The server's UI is told its own API address: left to itself it points the browser at
port 4200 whatever port it listens on, and the page stays blank.

On a shared host (a SLURM login node) anyone can reach 127.0.0.1, so the server answers only its own user: it
asks for credentials (basic auth) that are made on first use in a file only that user can read
(`$PREFECT_HOME/tokenmill-server-auth`, mode 0600, in a PREFECT_HOME of mode 0700, which also holds the
database), which the CLI, the flow and its deployments send and the UI asks for once; CSRF protection is on and
cross-origin requests are refused.

The UI asks for that line on a page of tokenmill's own, before Prefect's app starts (`ask_before_the_app`): Prefect's
app finds out it is not signed in only from a refused request, which shows an error toast, and on a run's page (the
link a run prints) it shows the error and never its sign-in form.
"""

from __future__ import annotations

import html
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil

START_TIMEOUT_S = 90
# How often a start looks whether the server answers: it takes seconds to start, and each look (a refused
# connection) costs about a millisecond; at 0.5 s a first run waited a quarter of a second more on average.
START_POLL_S = 0.1
STOP_TIMEOUT_S = 30
# Settings that already say where the UI should send the browser's API calls (e.g. behind a proxy).
UI_API_SETTINGS = ("PREFECT_SERVER_UI_API_URL", "PREFECT_UI_API_URL")


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()


def _state_file() -> Path:
    return prefect_home() / "tokenmill-server.json"


AUTH_FILE = "tokenmill-server-auth"
AUTH_USER = "tokenmill"


def private_home() -> Path:
    """PREFECT_HOME, made (or made again) readable by this user only: it holds the server's database (every run's
    config) and its credentials."""
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    if home.stat().st_mode & 0o077:
        home.chmod(0o700)
    return home


def auth_file() -> Path:
    return prefect_home() / AUTH_FILE


def server_auth(renew: bool = False) -> str:
    """The local server's credentials, `tokenmill:<secret>`: read from the auth file, made there on first use
    (written whole, then linked into place, so that two processes starting at once agree on one). `renew`: a new
    secret in its place (each server start), so that one that reached someone else once is good for no later
    server."""
    private_home()
    path = auth_file()
    if renew or not path.exists():
        made = path.with_name(f".{AUTH_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w") as f:
            f.write(f"{AUTH_USER}:{secrets.token_urlsafe(32)}\n")
        try:
            os.replace(made, path) if renew else os.link(made, path)
        except FileExistsError:  # another process made it first: its secret is the one
            pass
        finally:
            made.unlink(missing_ok=True)
    if path.stat().st_mode & 0o077:
        raise PermissionError(
            f"{path} can be read by other users: remove it (tokenmill makes a new one, and the server started with "
            "the old one must be stopped: tokenmill server stop) or chmod 600 it"
        )
    return path.read_text().strip()


def healthy(api_url: str, http: httpx.Client | None = None) -> bool:
    """Whether the server at `api_url` answers its health check (with `http`, a client kept for repeated checks:
    a new one makes a TLS context, 17 ms of CPU, even for http://)."""
    try:
        return (http or httpx).get(f"{api_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def running_server() -> dict | None:
    """The server tokenmill started earlier, if it still answers. One started without credentials (by a tokenmill
    before they were asked for) answers anyone on the host: it is stopped, and a run starts another. Nothing is
    sent to the recorded port, not even a health check, unless the server tokenmill started listens there
    (`listening_as_recorded`)."""
    state = _recorded()
    if state is None or not listening_as_recorded(state) or not healthy(state["api_url"]):
        return None
    if not state.get("auth"):
        stop_server()
        return None
    return state


def listening_as_recorded(state: dict) -> bool:
    """Whether the recorded server still listens at its recorded port: the process recorded is this user's `prefect
    server` (pids are reused), and it or a process it started holds the listening socket. Once it has stopped, any
    user of the host can listen on that port, and would be sent the password with the next call."""
    process = _server_process(state["pid"])
    port = urlsplit(state["api_url"]).port
    try:
        if process is None or process.uids().real != os.getuid():
            return False
        processes = [process, *process.children(recursive=True)]
    except psutil.Error:
        return False
    for each in processes:
        try:
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in each.net_connections("tcp")):
                return True
        except psutil.Error:
            continue
    return False


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int | None = None, new_secret: bool = True) -> dict:
    """Start `prefect server start` on 127.0.0.1 in the background and wait until it is healthy; with a new
    secret unless told to keep the last one (`supervised` restarting one its run's processes hold the secret of)."""
    home = private_home()
    port = port or free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    log_path = home / "tokenmill-server.log"
    prefect = Path(sys.executable).with_name("prefect")
    given = os.environ.get("PREFECT_SERVER_API_AUTH_STRING")  # credentials the user gave it (infra/ does) are kept
    env = {
        **os.environ,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_API_AUTH_STRING": given or server_auth(renew=new_secret),
        "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED": "true",
        "PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS": ui_url(api_url),  # its own UI's pages only
        # A call it answers 503 ("retry": SQLite busy) is logged too, with its cause: the UI shows only "Oops".
        "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true",
    }
    env.pop("PREFECT_API_URL", None)
    if not any(env.get(name) for name in UI_API_SETTINGS):
        env["PREFECT_SERVER_UI_API_URL"] = api_url
    # The UI's files as the server serves them: a copy in the private home (not in the shared venv), which
    # ask_before_the_app changes.
    env.setdefault("PREFECT_UI_STATIC_DIRECTORY", str(home / "ui"))
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client() as http:
        while not (healthy(api_url, http) and listening_as_recorded({"pid": process.pid, "api_url": api_url})):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"prefect server did not start on {api_url}; see {log_path}")
            time.sleep(START_POLL_S)
    if not given:
        ask_before_the_app(Path(env["PREFECT_UI_STATIC_DIRECTORY"]), auth_file())
    state = {"api_url": api_url, "pid": process.pid, "log": str(log_path), "auth": "given" if given else "file"}
    _state_file().write_text(json.dumps(state))
    return state


# Put in place of the script that starts Prefect's app: with the password kept (as Prefect's own sign-in keeps it),
# the app starts as before; without, this form asks for it, checks it with one request the app does not see, keeps
# it and then starts the app on the page that was opened.
SIGN_IN = """<script>
(function () {
  function startApp() {
    var app = document.createElement("script");
    app.type = "module";
    app.crossOrigin = "";
    app.src = "@APP@";
    document.head.appendChild(app);
  }
  if (localStorage.getItem("prefect-password")) return startApp();
  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("app");
    root.innerHTML = @FORM@;
    var form = document.getElementById("tokenmill-sign-in"), said = document.getElementById("tokenmill-said");
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var password = btoa(form.elements.line.value.trim());
      fetch("@BASE@/ui-settings").then(function (answer) { return answer.json(); }).then(function (settings) {
        return fetch(settings.api_url + "/admin/version", {headers: {Authorization: "Basic " + password}});
      }).then(function (answer) {
        if (!answer.ok) {
          said.textContent = answer.status == 401 ? "Refused: that is not this server's line."
                                                  : "The server answered " + answer.status + ".";
          return;
        }
        localStorage.setItem("prefect-password", password);
        root.innerHTML = "";
        startApp();
      }, function () { said.textContent = "The server cannot be reached."; });
    });
  });
})();
</script>"""
SIGN_IN_FORM = """<div style="min-height: 100vh; padding-top: 20vh; box-sizing: border-box; background: #1c1d21;
  font-family: system-ui, sans-serif; color: #e5e7eb">
 <form id="tokenmill-sign-in" style="max-width: 32rem; margin: 0 auto; padding: 2rem; background: #2b2d33;
   border-radius: 8px">
  <h1 style="margin: 0 0 1rem; font-size: 1.5rem">Prefect server</h1>
  <p style="margin: 0 0 1rem; line-height: 1.5">It answers only its user. Paste the line of
    <code>@AUTH@</code>:</p>
  <input name="line" type="password" placeholder="tokenmill:..." autocomplete="off" autofocus required
    style="box-sizing: border-box; width: 100%; padding: 0.5rem; font-size: 1rem; border-radius: 4px">
  <button type="submit" style="margin-top: 1rem; padding: 0.5rem 1.5rem; font-size: 1rem; color: #fff;
    background: #2563eb; border: 0; border-radius: 4px; cursor: pointer">Sign in</button>
  <p id="tokenmill-said" role="alert" style="margin: 1rem 0 0; color: #f87171; min-height: 1.5em"></p>
 </form>
</div>"""
APP_SCRIPT = re.compile(r'<script type="module" crossorigin src="(?P<src>[^"]+)"></script>')


def ask_before_the_app(static_root: Path, auth: Path) -> None:
    """Put the sign-in page (SIGN_IN) into the UI's index.html under `static_root` (PREFECT_UI_STATIC_DIRECTORY,
    which the server filled as it started, and fills again only for another Prefect version). A page Prefect
    lays out otherwise is left as it is, its own sign-in in place, and the log says so."""
    import logging

    for index in (static_root / "index.html", static_root / "v1" / "index.html"):
        page = index.read_text() if index.is_file() else ""
        if "tokenmill-sign-in" in page:
            return
        if found := APP_SCRIPT.search(page):
            src = found["src"]
            base = src.split("/assets/", 1)[0] if "/assets/" in src else ""
            form = json.dumps(SIGN_IN_FORM.replace("@AUTH@", html.escape(str(auth))))
            script = SIGN_IN.replace("@APP@", src).replace("@BASE@", base).replace("@FORM@", form)
            index.write_text(page[: found.start()] + script + page[found.end() :])
            return
    logging.getLogger(__name__).warning("the UI under %s is not laid out as expected: it asks for the password "
                                        "with Prefect's own sign-in page", static_root)  # fmt: skip


def ui_url(api_url: str) -> str:
    """The UI's address: the local server serves it at the root beside `/api`."""
    return api_url.removesuffix("/").removesuffix("/api")


def _server_process(pid: int) -> psutil.Process | None:
    """The process `pid` if it is still the `prefect server` tokenmill started (pids are reused)."""
    try:
        process = psutil.Process(pid)
        return process if "server" in process.cmdline() and process.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def _wait_until_ended(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of `processes` still running after `timeout` seconds (an exited one not yet reaped has ended)."""
    deadline = time.monotonic() + timeout
    while running := [p for p in processes if _running(p)]:
        if time.monotonic() > deadline:
            return running
        time.sleep(0.2)
    return []


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_server() -> bool:
    """Stop the server tokenmill started (its whole process group: uvicorn and the services), wait until it
    has exited; False if none was running."""
    try:
        state = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return False
    process = _server_process(state["pid"])
    if process is None:
        _state_file().unlink(missing_ok=True)
        return False
    processes = [process, *process.children(recursive=True)]
    group = os.getpgid(process.pid)
    os.killpg(group, signal.SIGTERM)
    if _wait_until_ended(processes, STOP_TIMEOUT_S):  # uvicorn lets open connections finish; the state is in the DB
        os.killpg(group, signal.SIGKILL)
        _wait_until_ended(processes, STOP_TIMEOUT_S)
    _state_file().unlink(missing_ok=True)
    return True


def ensure_api() -> str:
    """PREFECT_API_URL if set; else the URL of a local server (reused or started), exported with its credentials
    (PREFECT_API_AUTH_STRING) for this process's Prefect client and for the processes it starts. A URL set to the
    local server tokenmill started (in this PREFECT_HOME) gets its credentials too, whatever else is set: a process
    started by another's (a test's, a benchmark's) may carry that one's. A server the user gave credentials
    (PREFECT_SERVER_API_AUTH_STRING) takes the clients' the user gives them."""
    if url := os.environ.get("PREFECT_API_URL"):
        if (
            (state := _recorded())
            and state["api_url"] == url
            and state.get("auth") == "file"
            and (listening_as_recorded(state))
        ):
            os.environ["PREFECT_API_AUTH_STRING"] = server_auth()
        return url
    state = running_server() or start_server()
    os.environ["PREFECT_API_URL"] = state["api_url"]
    if state.get("auth") == "file":
        os.environ["PREFECT_API_AUTH_STRING"] = server_auth()
    os.environ["TOKENMILL_LOCAL_SERVER"] = state["api_url"]  # started by tokenmill: `supervised` may restart it
    return state["api_url"]


def retry_refused_connections() -> None:
    """Make every Prefect API client of this process retry a refused connection as it does a timeout (5 times,
    with backoff: about a minute). Prefect's client does so only once that client has connected, so that a
    wrong URL fails at once; a client made while the server restarts (a pod rescheduled, a deploy) failed the
    run at its first call. The URL is known good here: the run has reached it."""
    from prefect.client.base import PrefectHttpxAsyncClient, PrefectHttpxSyncClient

    for client_class in (PrefectHttpxAsyncClient, PrefectHttpxSyncClient):
        if getattr(client_class, "_tokenmill_retries_refused", False):
            continue
        made = client_class.__init__

        def __init__(self, *args, _made=made, **kwargs):
            _made(self, *args, **kwargs)
            self._has_connected = True  # prefect.client.base: ConnectError is retried once this is set

        client_class.__init__ = __init__
        client_class._tokenmill_retries_refused = True


CHECK_EVERY_S = 2


@contextmanager
def supervised(api_url: str) -> Iterator[None]:
    """While the block runs, restart the local server tokenmill started if it dies (same port, same database),
    as a deployment's orchestrator restarts a server pod: the run's Prefect client retries its calls with
    backoff (about a minute in all) and goes on. Servers named by PREFECT_API_URL are someone else's to run."""
    if os.environ.get("TOKENMILL_LOCAL_SERVER") != api_url:
        yield
        return
    stop = threading.Event()
    port = int(api_url.rsplit(":", 1)[1].split("/")[0])

    def watch() -> None:
        while not stop.wait(CHECK_EVERY_S):
            state = _recorded()
            if state and _alive(state["pid"]) or healthy(api_url):
                continue
            try:
                start_server(port, new_secret=False)  # the run's processes hold its secret
            except RuntimeError:
                pass  # tried again at the next check; the run's own calls report the outage

    thread = threading.Thread(target=watch, name="tokenmill-server-supervisor", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


def _recorded() -> dict | None:
    try:
        return json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a killed child not yet reaped is a zombie, not alive
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
