"""Hosts on one machine, for tests that need several network addresses: each host is a network namespace with its
own address on a bridge (`ip netns`, a veth pair), and each process started on it gets its own mount namespace
whose /tmp is the host's own directory (nothing else of one host's files is another's: they share only the
read-only code, as hosts share an image). The test's own process reaches every host through the bridge. A
host's link set down cuts it off (no route, no packet, as a pulled cable); set up, it is back.

Everything is made as the test starts and removed when it ends, also when it fails: the processes of every host
are killed, the namespaces and the bridge deleted. Traffic goes only to these addresses and to loopback. Needs
root and iproute2 (`Network.available` says why not)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

# What every host sees at its own path, as hosts share an image: this repository (its code, test data and .venv).
# A clone under /tmp would be hidden by the host's /tmp, so it is bound into it first.
CODE = (Path(__file__).resolve().parents[1],)


def on_host(root: Path) -> str:
    """The shell line each process on a host runs in its own mount namespace: the host's directory `root` becomes
    /tmp and the working directory, with the code of `CODE` that lies under /tmp still at its own path."""
    keep = [path for path in CODE if path.is_relative_to("/tmp") and path.exists()]
    binds = "".join(
        f'mkdir -p "{root}/{rel}" && mount --bind "{path}" "{root}/{rel}" && '
        for path in keep
        for rel in [path.relative_to("/tmp")]
    )
    return binds + 'mount --rbind "$0" /tmp && cd /tmp && exec "$@"'


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class Host:
    def __init__(self, network: Network, name: str, index: int) -> None:
        self.name, self.ip = name, f"{network.prefix}.{10 + index}"
        self.namespace, self.link = f"{network.tag}-{name}", f"{network.tag}v{index}"
        self.root = network.root / name  # its /tmp
        self.root.mkdir(parents=True)
        self.processes: list[subprocess.Popen] = []

    def start(self, command: list[str], env: dict[str, str], log: str, restart: bool = False) -> subprocess.Popen:
        """Start `command` on this host, in a session of its own, its output to `log` in the host's directory;
        `restart`: started again a second after it ends, as a container platform's restart policy does (infra/'s
        compose services, a Kubernetes Deployment's pods)."""
        if restart:
            command = ["sh", "-c", 'while :; do "$@"; sleep 1; done', "supervisor", *command]
        with open(self.root / log, "ab") as out:
            process = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace, "unshare", "--mount", "--propagation", "private",
                 "sh", "-c", on_host(self.root), str(self.root), *command],
                env={**env, "HOME": "/tmp", "TMPDIR": "/tmp"}, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.processes.append(process)
        return process

    def cut(self) -> None:
        """Take the host off the network: its end of the cable goes down."""
        _ip("link", "set", self.link, "down")

    def restore(self) -> None:
        _ip("link", "set", self.link, "up")

    def kill(self) -> None:
        """Every process in the host's network namespace (those started here, and their children)."""
        pids = _ip("netns", "pids", self.namespace, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                pass


class Network:
    """A bridge with hosts on it (`add`); a context manager that removes them all at its end."""

    def __init__(self, root: Path) -> None:
        self.tag = f"tm{os.getpid() % 100000}"  # interface names: at most 15 characters
        self.prefix = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
        self.bridge, self.root = f"{self.tag}br", root
        self.hosts: list[Host] = []

    @staticmethod
    def available() -> str | None:
        """Why hosts cannot be made here, or None."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        for tool in ("ip", "unshare", "mount"):
            if shutil.which(tool) is None:
                return f"no `{tool}` on this machine"
        probe = f"tmprobe{os.getpid() % 100000}"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode:
            return f"`ip netns add` failed: {made.stderr.strip()}"
        _ip("netns", "delete", probe, check=False)
        return None

    def __enter__(self) -> Network:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.prefix}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def add(self, name: str) -> Host:
        host = Host(self, name, len(self.hosts))
        self.hosts.append(host)
        _ip("netns", "add", host.namespace)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
        _ip("link", "set", host.link, "master", self.bridge, "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", host.namespace, "link", "set", "eth0", "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")
        return host

    def __exit__(self, *exc) -> None:
        for host in reversed(self.hosts):
            host.kill()
            _ip("netns", "delete", host.namespace, check=False)  # its veth pair goes with it
        _ip("link", "delete", self.bridge, check=False)


def wait_for(condition, timeout: float, what: str, interval: float = 0.2):
    """Poll `condition` until it returns something true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")
