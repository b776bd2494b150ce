"""`gated://<local path>`: a local file whose start readers read only once the test opens the gate (tests/conftest.py:
`Gate`).

A test that needs a run still going (its cluster up, its shards being tokenized) gives the run an input through this
filesystem instead of counting on the run's length: a read from the file's first byte (the shard that begins the file)
waits while `<path>.gate` exists, and says who waits in `<path>.waiting`; reads elsewhere (the partition aligning its
cuts to line ends, the file's later shards) go through. Listing and sizes are the local file's. The run's processes
find it through fsspec's entry points (the dist-info beside this file, on their PYTHONPATH): nothing in tokenmill
knows of it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

WAIT_S = 0.05


def wait_at_gate(path: str) -> None:
    if not os.path.exists(f"{path}.gate"):
        return
    waiting = f"{path}.waiting"
    with open(waiting, "w") as f:  # who waits, for the test's messages
        f.write(f"{os.getpid()} {threading.current_thread().name}\n")
    while os.path.exists(f"{path}.gate"):
        time.sleep(WAIT_S)
    with contextlib.suppress(FileNotFoundError):  # another reader waited too
        os.unlink(waiting)


class GatedFile(LocalFileOpener):
    """The local file, its reads from the first byte held at the gate."""

    def _at_start(self) -> None:
        if self.f.tell() == 0:
            wait_at_gate(self.path)

    def read(self, *args, **kwargs):
        self._at_start()
        return super().read(*args, **kwargs)

    def readinto(self, *args, **kwargs):
        self._at_start()
        return self.f.readinto(*args, **kwargs)

    def readline(self, *args, **kwargs):
        self._at_start()
        return super().readline(*args, **kwargs)

    def readlines(self, *args, **kwargs):
        self._at_start()
        return super().readlines(*args, **kwargs)


class GatedFileSystem(AbstractFileSystem):
    protocol = "gated"
    root_marker = "/"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.local = LocalFileSystem()

    @classmethod
    def _strip_protocol(cls, path):
        path = path[len("gated://") :] if path.startswith("gated://") else path
        return LocalFileSystem._strip_protocol(path)

    def ls(self, path, detail=True, **kwargs):
        return self.local.ls(self._strip_protocol(path), detail=detail, **kwargs)

    def info(self, path, **kwargs):
        return self.local.info(self._strip_protocol(path), **kwargs)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        path = self._strip_protocol(path)
        if "r" not in mode:
            return self.local._open(path, mode, autocommit=autocommit, **kwargs)
        return GatedFile(path, mode, fs=self.local, **kwargs)
