"""The tests' `tokenmill` commands, each in a process of its own forked from an interpreter that has already
imported what a command imports (the CLI, Prefect, Dask, the flow): about 3 s of CPU that each of the suite's
commands paid again on the 2-core test machine. From the fork on, the child is the command as a user runs it: its
own process, arguments, environment, working directory and standard streams, and the interpreter's usual exit (exit
handlers run, threads joined). An interpreter serves the one environment and working directory it was started
with, since Prefect's settings and Dask's config are read as they are imported; it starts at a pair's second
command, so a pair used once costs no more than before. `TOKENMILL_TESTS_FRESH=1` runs every command in a fresh
interpreter instead. An interpreter listens on a Unix socket in a folder of the test process's, for its user alone
(mode 0700): no other user can ask it for a command.

Imports nothing of tokenmill's: the interpreter loads this file by its path, before anything else."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import BinaryIO

FRESH = os.environ.get("TOKENMILL_TESTS_FRESH") == "1"
INTERPRETERS_KEPT = 2  # per test process: the suite's commands share a few environments, most of them one
VARYING = {"PYTEST_CURRENT_TEST"}  # pytest's, changed for each test; read by nothing as it is imported


def serve(path: str) -> None:
    """The interpreter's body: import a command's modules, listen on `path`, and fork a child for each command
    asked; returns in the child only, set up as asked, for the caller to run the command."""
    started = dict(os.environ)  # what the imports below add to it stays, as in a command's own process
    import flows.cli  # noqa: F401 (what every command imports)
    import flows.server  # noqa: F401 (and what `run` and `rerun` import, in the order they do)
    from flows.startup import without_collector

    with without_collector():
        import flows.main  # noqa: F401
        import flows.rerun  # noqa: F401

    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".part")
    listener.listen(16)
    os.rename(path + ".part", path)  # whole: the tests connect once it is there
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:  # the tests' process gone: so is this one
        if select.select([listener], [], [], 0.1)[0]:
            connection, _ = listener.accept()
            message, streams, _, _ = socket.recv_fds(connection, 1 << 20, 3)
            asked = json.loads(message)
            pid = os.fork()
            if pid == 0:
                listener.close()
                for held in [connection, *children.values()]:
                    held.close()
                for number, stream in enumerate(streams):
                    os.dup2(stream, number)
                    os.close(stream)
                os.chdir(asked["cwd"])
                for name in started.keys() - asked["env"].keys():
                    os.environ.pop(name, None)
                os.environ.update({name: value for name, value in asked["env"].items() if started.get(name) != value})
                sys.argv = asked["argv"]
                return
            for stream in streams:
                os.close(stream)
            connection.sendall(b"%d\n" % pid)
            children[pid] = connection
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = children.pop(pid)
            try:
                connection.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
            except OSError:
                pass  # the test that asked has gone
            connection.close()
    os._exit(0)


def fresh(command: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    """`command` started in a fresh process, its output read as text."""
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def keep(stream: BinaryIO, log: Path) -> None:
    """What `stream` says, written to `log` as it comes."""
    with log.open("wb", buffering=0) as kept:
        while chunk := stream.read1():
            kept.write(chunk)


class Forked:
    """A command one of the interpreters forked, with what `subprocess.Popen` offers that the tests use: its pid,
    `communicate` (text, with a timeout), `wait`, `send_signal`, `kill` and `returncode` (`run_or_show_stacks`)."""

    def __init__(self, path: Path, argv: list[str], env: dict, cwd: Path):
        self.args = argv
        self.returncode: int | None = None
        out, out_end = os.pipe()
        err, err_end = os.pipe()
        self.connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.connection.connect(str(path))
        asked = json.dumps({"argv": argv, "env": env, "cwd": str(cwd)}).encode()
        socket.send_fds(self.connection, [asked], [0, out_end, err_end])  # stdin inherited, as Popen's
        os.close(out_end)
        os.close(err_end)
        self.replies = b""
        self.pid = int(self._line(None))
        self.texts = ["", ""]
        self.readers = [
            threading.Thread(target=self._read, args=(i, end), daemon=True) for i, end in enumerate([out, err])
        ]
        for reader in self.readers:
            reader.start()

    def _read(self, index: int, end: int) -> None:
        with open(end, encoding=None) as stream:  # the locale's encoding, newlines translated: Popen(text=True)'s
            self.texts[index] = stream.read()

    def _line(self, timeout: float | None) -> bytes:
        self.connection.settimeout(timeout)
        while b"\n" not in self.replies:
            try:
                more = self.connection.recv(64)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            if not more:
                raise RuntimeError(f"the interpreter that forked {self.args} ended before the command did")
            self.replies += more
        line, self.replies = self.replies.split(b"\n", 1)
        return line

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self.readers:
            reader.join(None if deadline is None else max(0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.01, deadline - time.monotonic()))
        return self.texts[0], self.texts[1]

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = int(self._line(timeout))
            self.connection.close()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Interpreters:
    """The interpreters of one test process, one per environment and working directory seen twice, the
    `INTERPRETERS_KEPT` used last kept."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.chmod(0o700)  # its sockets run commands as this user
        self.running: dict[tuple, tuple[subprocess.Popen, Path]] = {}
        self.asked: Counter = Counter()

    def start(self, command: list[str], env: dict, cwd: Path) -> subprocess.Popen | Forked:
        """`command` started as `subprocess.Popen` would (text pipes for its output), forked where it can be."""
        key = (tuple(sorted((k, v) for k, v in env.items() if k not in VARYING)), str(cwd))
        self.asked[key] += 1
        if FRESH or self.asked[key] < 2:
            return fresh(command, env, cwd)
        if key not in self.running:
            self.running[key] = self._interpreter(env, cwd)
        self.running[key] = self.running.pop(key)  # the last used last
        while len(self.running) > INTERPRETERS_KEPT:
            self._stop(next(iter(self.running)))
        return Forked(self.running[key][1], command, env, cwd)

    def _interpreter(self, env: dict, cwd: Path) -> tuple[subprocess.Popen, Path]:
        number = len(list(self.folder.glob("*.log")))
        path, log = self.folder / f"{number}.socket", self.folder / f"{number}.log"
        # As the installed `tokenmill` script starts: its folder first on sys.path, not the working directory
        # (where a project of the user's may have a `flows` package of its own)
        code = (
            f"import sys; sys.path[0] = {str(Path(sys.executable).parent)!r}\n"
            "import importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('prewarmed', {__file__!r})\n"
            "prewarmed = importlib.util.module_from_spec(spec); spec.loader.exec_module(prewarmed)\n"
            f"prewarmed.serve({str(path)!r})\n"
            "from flows.cli import app\n"
            "sys.exit(app())\n"
        )
        # Its output a pipe, as a command's is: the interpreter sets its streams up for the kind of file they are
        process = subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        logging = threading.Thread(target=keep, args=(process.stdout, log), daemon=True)
        logging.start()
        deadline = time.monotonic() + 120
        while not path.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                logging.join(5)
                raise RuntimeError(f"the tests' interpreter for `tokenmill` did not start:\n{log.read_text()}")
            time.sleep(0.05)
        return process, path

    def _stop(self, key: tuple) -> None:
        process, path = self.running.pop(key)
        process.terminate()
        process.wait()
        path.unlink(missing_ok=True)

    def close(self) -> None:
        for key in list(self.running):
            self._stop(key)
