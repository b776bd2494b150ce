"""`gated://<local path>`: a local file whose readers wait at the gate the test holds (tests/conftest.py: `Gate`).

A test that needs a run still going (its cluster up, its shards being tokenized) gives the run an input through this
filesystem instead of counting on the run's length: opening the file for reading waits while `<path>.gate` exists,
and says so in `<path>.waiting`; the test removes the gate when it is done. Listing and sizes are the local file's.
The run's processes find it through fsspec's entry points (the dist-info beside this file, on their PYTHONPATH):
nothing in tokenmill knows of it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

WAIT_S = 0.05


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

    def _open(self, path, mode="rb", **kwargs):
        path = self._strip_protocol(path)
        if "r" in mode and os.path.exists(f"{path}.gate"):
            waiting = f"{path}.waiting"
            with open(waiting, "w") as f:  # who waits, for the test's messages
                f.write(f"{os.getpid()} {threading.current_thread().name}\n")
            while os.path.exists(f"{path}.gate"):
                time.sleep(WAIT_S)
            with contextlib.suppress(FileNotFoundError):  # another reader waited too
                os.unlink(waiting)
        return self.local._open(path, mode, **kwargs)
