"""One storage abstraction for every stage: a directory that is a local path or an fsspec URL (s3://...).

Writes are atomic: a file appears under its final name complete or not at all. Locally that is a
temporary name in the same directory and `os.replace`; on object stores a single PUT of a file
written locally first (an object is never visible half-written).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

CHUNK = 8 << 20


def options_for(url: str, storage_options: dict | None) -> dict:
    """The storage options that apply to `url`: none for local paths."""
    return (storage_options or {}) if "://" in url and not url.startswith("file://") else {}


def expand_paths(patterns: list[str], storage_options: dict | None = None) -> list[str]:
    """Expand local paths, globs and fsspec URLs into a sorted, de-duplicated list of file URLs."""
    urls: set[str] = set()
    for pattern in patterns:
        fs, _ = fsspec.core.url_to_fs(pattern, **options_for(pattern, storage_options))
        matches = fs.glob(pattern) if any(c in pattern for c in "*?[") else [pattern]
        matches = [m for m in matches if fs.isfile(m)]
        if not matches:
            raise FileNotFoundError(f"input path {pattern!r} matches no file")
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        for m in matches:
            urls.add(m if isinstance(fs, LocalFileSystem) else f"{protocol}://{m.split('://')[-1]}")
    return sorted(urls)


class Store:
    """A directory (local or remote) addressed by relative paths."""

    def __init__(self, root: str | Path, storage_options: dict | None = None):
        self.url = str(root).rstrip("/")
        self.storage_options = options_for(self.url, storage_options)
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.is_local = isinstance(self.fs, LocalFileSystem)

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def url_of(self, rel: str) -> str:
        """A URL for `rel` that any process can open with fsspec (absolute path when local)."""
        return self.path(rel) if self.is_local else self.fs.unstrip_protocol(self.path(rel))

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))

    def size(self, rel: str) -> int:
        return self.fs.size(self.path(rel))

    def open(self, rel: str, mode: str = "rb"):
        return self.fs.open(self.path(rel), mode)

    def list(self, prefix: str = "") -> list[str]:
        """Relative paths of all files under `prefix`, sorted."""
        base = self.path(prefix).rstrip("/") if prefix else self.root
        if not self.fs.exists(base):
            return []
        return sorted(p[len(self.root) + 1 :] for p in self.fs.find(base))

    @contextmanager
    def writing(self, rel: str) -> Iterator[Path]:
        """Yield a local path to write `rel` into; it is committed atomically when the block succeeds."""
        if self.is_local:
            final = Path(self.path(rel))
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
            try:
                yield tmp
                os.replace(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
        else:
            with tempfile.TemporaryDirectory(prefix="tokenmill-") as tmpdir:
                tmp = Path(tmpdir) / Path(rel).name
                yield tmp
                self.fs.put_file(str(tmp), self.path(rel))

    @contextmanager
    def local_copies(self, *rels: str) -> Iterator[list[Path]]:
        """Local paths holding `rels` for reading (the files themselves when the store is local)."""
        if self.is_local:
            yield [Path(self.path(rel)) for rel in rels]
            return
        with tempfile.TemporaryDirectory(prefix="tokenmill-") as tmpdir:
            paths = [Path(tmpdir) / f"{i}-{Path(rel).name}" for i, rel in enumerate(rels)]
            for rel, path in zip(rels, paths, strict=True):
                self.fs.get_file(self.path(rel), str(path))
            yield paths

    def read_bytes(self, rel: str) -> bytes:
        with self.open(rel) as f:
            return f.read()

    def write_bytes(self, rel: str, data: bytes) -> None:
        with self.writing(rel) as tmp:
            tmp.write_bytes(data)

    def write_json(self, rel: str, obj) -> None:
        self.write_bytes(rel, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())

    def read_json(self, rel: str):
        with self.open(rel) as f:
            return json.load(f)

    def put(self, local: str | Path, rel: str) -> None:
        """Copy a local file into the store atomically."""
        with self.writing(rel) as tmp:
            shutil.copyfile(local, tmp)

    def sha256(self, rel: str) -> str:
        digest = hashlib.sha256()
        with self.open(rel) as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def remove(self, rel: str) -> None:
        if self.exists(rel):
            self.fs.rm(self.path(rel))
