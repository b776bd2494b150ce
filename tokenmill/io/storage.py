"""One storage abstraction for every stage: a directory that is a local path or an fsspec URL (s3://...).

Writes are atomic: a file appears under its final name complete or not at all. Locally that is a
temporary name in the same directory and `os.replace`; on object stores a single PUT of a file
written locally first (an object is never visible half-written).

Faults: on object stores every request is retried with backoff (botocore's standard mode, then s3fs's own
retries for connection resets and SlowDown; every request tokenmill makes is idempotent, so each is safe to
repeat), with bounded timeouts, so a dead store ends an operation within `give_up_s()`. What still fails
raises `StorageError`, naming the file or object and the cause, never a library's traceback as the message.
"""

from __future__ import annotations

import bisect
import contextvars
import copy
import errno
import hashlib
import os
import posixpath
import shutil
import stat
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import fsspec
import orjson
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import merge_offset_ranges

from tokenmill.io.direct import UncachedFile
from tokenmill.io.names import DATA_ENDINGS, names_its_format

CHUNK = 8 << 20
# Spans of an object less than this apart are read with one GET (`Store.read_ranges`), which holds the bytes between
# them too: at most this much more than the spans per span, so that the gaps of a sample spread over a GB shard do not
# become the shard in memory (1 MB let 1,000 documents 1 MB apart fetch 1 GB)
RANGE_GAP = 128 << 10
JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS  # every JSON file tokenmill writes
STREAMED = "<items written one at a time: Store.write_json>"  # where a list's items stream into the text
UNFINISHED = ".tmp-"  # in the name of a local file `Store.writing` has not committed yet

# Every s3:// request: botocore's standard retry mode (exponential backoff with jitter; retries throttling,
# 5xx and connection errors), bounded connect and read timeouts, and s3fs's own tries around it (SlowDown,
# resets, cut-off bodies). s3fs nests its tries for reads (a ranged read retried inside a retried read), so its
# default of 5 would make a read from a store that stopped answering take 5 * 5 * max_attempts read timeouts
# (half an hour); 2 keeps it to `give_up_s()`.
S3_MAX_ATTEMPTS = 4  # botocore's, per s3fs try
S3FS_RETRIES = 2
S3_CONNECT_TIMEOUT_S = 5
S3_READ_TIMEOUT_S = 15


def read_timeout() -> float:
    """Seconds without a byte from the store before a request is retried (TOKENMILL_S3_READ_TIMEOUT)."""
    return float(os.environ.get("TOKENMILL_S3_READ_TIMEOUT", S3_READ_TIMEOUT_S))


def give_up_s() -> float:
    """The longest one storage operation can take against a store that accepts connections and never answers
    (about 4.5 min with the defaults), backoff included."""
    backoff = sum(min(2**attempt, 20) for attempt in range(S3_MAX_ATTEMPTS - 1))
    s3fs_backoff = sum(min(1.7**i * 0.1, 15) for i in range(S3FS_RETRIES))
    tries = S3FS_RETRIES**2  # nested, for reads
    return tries * (S3_MAX_ATTEMPTS * max(S3_CONNECT_TIMEOUT_S, read_timeout()) + backoff + s3fs_backoff)


def s3_defaults() -> dict:
    from s3fs import S3FileSystem  # here, not at import: 1 s, and only runs that touch s3:// need it

    S3FileSystem.retries = S3FS_RETRIES  # a class attribute, not an option
    return {
        # Other processes rewrite plan.json, markers and LATEST: a listing cached by a long-lived process (a Dask
        # worker, `tokenmill serve`) would open them with a stale ETag (412 PreconditionFailed) or miss them.
        "use_listings_cache": False,
        "config_kwargs": {
            "retries": {"mode": "standard", "max_attempts": S3_MAX_ATTEMPTS},
            "connect_timeout": S3_CONNECT_TIMEOUT_S,
            "read_timeout": read_timeout(),
        },
    }


def options_for(url: str, storage_options: dict | None) -> dict:
    """The storage options that apply to `url`: none for local paths; for s3:// the retry and timeout
    defaults above under what the caller gave."""
    if "://" not in url or url.startswith("file://"):
        return {}
    if url.startswith(("s3://", "s3a://")):
        return s3_defaults() | (storage_options or {})
    return storage_options or {}


class StorageError(OSError):
    """A read, write or listing that failed for good (after the retries that were safe); the message names
    the file or object and the cause."""


class Planted(StorageError):
    """Something in the output location that tokenmill did not make and will not follow: a path read from a file
    there that leads outside it, or a link or special file where tokenmill keeps its own files. The message names it;
    nothing was read, written or removed through it."""


PLANTED_HINT = (
    "tokenmill never writes this: someone who can write the output location put it there. Nothing was read, written "
    "or removed through it; look at who else writes there, remove it, and run again"
)


def inside(rel: str) -> str | None:
    """`rel` normalised (no `.`, `..` or doubled `/`), or None where it is no path inside a directory: absolute,
    empty, the directory itself, or leading out of it (`..`)."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel or "\\" in rel:
        return None
    normal = posixpath.normpath(rel)
    if normal in (".", "..") or normal.startswith("../"):
        return None
    return normal


DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}  # a local write that no retry would fix


def cause(error: BaseException) -> str:
    """A one-line cause: the exception's type and message; for s3fs's translation of a botocore error into
    a bare OSError, the botocore error itself (it has the S3 error code and the retries spent)."""
    inner = error.__cause__ or error.__context__
    if type(error) is OSError and inner is not None:
        error, inner = inner, None
    text = f"{type(error).__name__}: {error}".strip()
    if inner is not None and str(inner) and str(inner) not in text:
        text += f" (from {type(inner).__name__}: {inner})"
    return text


def list_files(patterns: list[str], storage_options: dict | None = None) -> list[dict]:
    """The files that local paths, globs and fsspec URLs name now, sorted by URL, each with its fingerprint:
    `{"path", "size", "etag"}` where the store gives an ETag (S3), else `{"path", "size", "mtime"}`. A directory
    (an S3 prefix) names its data files at any depth (`files_under`). One listing per pattern (its entries carry
    their size and ETag or mtime), so a prefix of 100,000 objects is a few hundred requests, not one per file."""
    found: dict[str, dict] = {}
    for pattern in patterns:
        fs, _ = fsspec.core.url_to_fs(pattern, **options_for(pattern, storage_options))
        if any(c in pattern for c in "*?["):
            matches = fs.glob(pattern, detail=True)
        else:
            try:
                matches = {pattern: fs.info(pattern)}
            except FileNotFoundError:
                matches = {}
            if any(info.get("type") == "directory" for info in matches.values()):
                matches = files_under(fs, pattern)
        # A local glob describes a link itself ("other"): an input file may be a link to one (not in the output)
        matches = {m: _linked(fs, m) if info.get("islink") else info for m, info in matches.items()}
        matches = {m: info for m, info in matches.items() if info.get("type") == "file"}
        if not matches:
            raise FileNotFoundError(f"input path {pattern!r} matches no file")
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        for m, info in matches.items():
            url = m if isinstance(fs, LocalFileSystem) else f"{protocol}://{m.split('://')[-1]}"
            found[url] = {"path": url, "size": int(info["size"]), **_version_of(info)}
    return [found[url] for url in sorted(found)]


def _linked(fs: fsspec.AbstractFileSystem, link: str) -> dict:
    """What a local link among the input's files names; a link to nothing (a source tree's stray one) is an error
    naming it and where it points, not a traceback from the listing."""
    try:
        return fs.info(link)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"input file {link} is a symbolic link to {os.readlink(link)!r}, which does not exist: remove the link, "
            "or name the files without it in input.paths"
        ) from None


def files_under(fs: fsspec.AbstractFileSystem, directory: str) -> dict[str, dict]:
    """The files a directory in `input.paths` stands for, at any depth, in one listing: those whose name gives
    their format (`names_its_format`), as a user who points at a corpus's directory means."""
    root = fs._strip_protocol(directory).rstrip("/")
    listed = _local_find(root) if isinstance(fs, LocalFileSystem) else fs.find(directory, detail=True)
    found = {path: info for path, info in listed.items() if names_its_format(path[len(root) + 1 :])}
    if not found:
        raise FileNotFoundError(
            f"input path {directory!r} is a directory with no {', '.join(DATA_ENDINGS)} file under it (compressed or "
            f"not, hidden ones aside; {len(listed)} other files): name other files with a glob, e.g. "
            f"'{directory.rstrip('/')}/**/*.md'"
        )
    return found


def _local_find(root: str) -> dict[str, dict]:
    """What `LocalFileSystem.find(root, detail=True)` lists, with the fields `list_files` reads, by `os.scandir`
    alone: fsspec's entry costs 10 us of Python a file (a second for a source tree's 100,000). As fsspec's, a link
    (to a file or a directory) is listed with `islink`, not followed; a file that goes as it is listed is left out."""
    found: dict[str, dict] = {}
    directories = [root]
    while directories:
        with os.scandir(directories.pop()) as entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        directories.append(entry.path)
                        continue
                    status = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                kind = "file" if stat.S_ISREG(status.st_mode) else "other"
                found[entry.path] = {"size": status.st_size, "mtime": status.st_mtime, "type": kind,
                                     "islink": entry.is_symlink()}  # fmt: skip
    return found


def _version_of(info: dict) -> dict:
    """What tells this version of a file from another of the same size: the ETag (a content hash for plain
    uploads) where the store gives one, else the modification time."""
    if etag := info.get("ETag") or info.get("etag"):
        return {"etag": str(etag).strip('"')}
    mtime = info.get("mtime") or info.get("LastModified") or info.get("last_modified")
    return {"mtime": mtime.isoformat() if hasattr(mtime, "isoformat") else mtime}


def local_stamp(status: os.stat_result) -> dict | None:
    """A local file's stamp: what a write to it or its replacement changes (the size, the modification time; the
    inode and the owner, which a file put in its place has others of). None for anything but a regular file."""
    if not stat.S_ISREG(status.st_mode):
        return None
    return {"bytes": status.st_size, "inode": status.st_ino, "mtime_ns": status.st_mtime_ns, "uid": status.st_uid}


def object_stamp(info: dict) -> dict:
    """An object's stamp: its size and what tells this version of it from another (`_version_of`: its ETag)."""
    return {"bytes": info["size"], **_version_of(info)}


class Store:
    """A directory (local or remote) addressed by relative paths."""

    def __init__(self, root: str | Path, storage_options: dict | None = None, trusts_stamps: bool = False):
        self.url = str(root).rstrip("/")
        # Whether a committed file whose stamp is as recorded is taken as intact without reading it
        # (output.reuse_check: stamp; `commits.check`)
        self.trusts_stamps = trusts_stamps
        self.storage_options = options_for(self.url, storage_options)
        # A copy: botocore rewrites the retries it is given (max_attempts into total_max_attempts) as its client is
        # made, and two stores of the same options must stay equal (publish copies server-side between them)
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **copy.deepcopy(self.storage_options))
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self._directories: set[str] = set()  # local directories under the root found to be directories, not links

    def path(self, rel: str) -> str:
        """The store's path of `rel`, which must stay inside it (`inside`). Locally, every directory between the
        root and the file must be a directory, not a link to one elsewhere (`Planted`)."""
        if rel == "":
            return f"{self.root}/"  # the root itself, to list
        normal = inside(rel)
        if normal is None:
            raise Planted(f"{rel!r} is no path inside {self.url}; nothing was read, written or removed there")
        if self.is_local:
            self._no_linked_directory(posixpath.dirname(normal))
        return f"{self.root}/{normal}"

    def stored_path(self, rel, named_in: str) -> str:
        """A path read from the store's file `named_in` (a commit marker's file list, a manifest, LATEST), normalised,
        if it stays inside the store; else `Planted` naming that file."""
        normal = inside(rel)
        if normal is None:
            raise Planted(f"{self.url_of(named_in)} names {rel!r}, a path outside {self.url}: {PLANTED_HINT}")
        return normal

    def stored_name(self, name, named_in: str) -> str:
        """A name read from the store's file `named_in` (LATEST, a manifest's previous version) of a directory right
        under the store; else `Planted` naming that file."""
        if not isinstance(name, str) or inside(name) != name or "/" in name:
            raise Planted(f"{self.url_of(named_in)} names {name!r}, which is no version in {self.url}: {PLANTED_HINT}")
        return name

    def _no_linked_directory(self, directory: str) -> None:
        """Raise `Planted` where a directory on the way from the root to `directory` is a link or not a directory
        (a missing one is made by whoever writes there: `_make_directories`)."""
        if not directory or directory in self._directories:
            return
        self._no_linked_directory(posixpath.dirname(directory))
        try:
            mode = os.lstat(f"{self.root}/{directory}").st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(mode):
            what = "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"
            raise Planted(f"{self.root}/{directory} is {what}, where tokenmill keeps a directory of its own: "
                          f"{PLANTED_HINT}")  # fmt: skip
        self._directories.add(directory)

    def make_directories(self, rel: str) -> None:
        """Locally, the directory `rel` and those above it under the root, made where missing, never through a link
        (`Planted`); nothing on object stores, which have no directories."""
        if self.is_local:
            self.path(rel)  # inside the store (else `Planted`)
            self._make_directories(inside(rel))

    def _make_directories(self, directory: str) -> None:
        """Make the local directory `directory` (relative) and those above it that are missing, never through a
        link (a link or a file in the way: `Planted`). The root is made as its path says (the user chose it)."""
        if directory in self._directories:
            return
        if not directory:
            os.makedirs(self.root, exist_ok=True)
            self._directories.add(directory)
            return
        self._make_directories(posixpath.dirname(directory))
        try:
            os.mkdir(f"{self.root}/{directory}")
        except FileExistsError:
            pass
        self._no_linked_directory(directory)

    def regular(self, rel: str) -> str:
        """The local path of `rel`, which must be a regular file where it exists (a link or a special file where
        tokenmill keeps its own: `Planted`)."""
        path = self.path(rel)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return path
        if not stat.S_ISREG(mode):
            what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
            raise Planted(f"{path} is {what}, where tokenmill keeps a file of its own: {PLANTED_HINT}")
        return path

    def url_of(self, rel: str) -> str:
        """A URL for `rel` that any process can open with fsspec (absolute path when local)."""
        return self.path(rel) if self.is_local else self.fs.unstrip_protocol(self.path(rel))

    @contextmanager
    def failing_as(self, action: str, rel: str = "") -> Iterator[None]:
        """Re-raise a storage library's failure as `StorageError` naming `action` and the file or object
        (a missing file stays FileNotFoundError; what the caller's own code raises is not touched)."""
        try:
            yield
        except (FileNotFoundError, StorageError):
            raise
        except Exception as e:
            if not self._is_storage_failure(e):
                raise
            raise StorageError(f"{action} {self.url_of(rel) if rel else self.url} failed: {cause(e)}") from e

    def _is_storage_failure(self, error: Exception) -> bool:
        if isinstance(error, OSError | TimeoutError):
            return True
        # botocore and aiohttp errors that s3fs let through (its retries spent)
        return not self.is_local and type(error).__module__.split(".")[0] in ("botocore", "aiohttp", "aiobotocore")

    def exists(self, rel: str) -> bool:
        """Whether `rel` is there (locally: a link counts, whatever it points at, so that reading it is refused)."""
        with self.failing_as("checking", rel):
            return os.path.lexists(self.path(rel)) if self.is_local else self.fs.exists(self.path(rel))

    def is_regular(self, rel: str) -> bool:
        """Whether the local file `rel` is a regular file (not a link, a directory, a FIFO...)."""
        try:
            return stat.S_ISREG(os.lstat(self.path(rel)).st_mode)
        except FileNotFoundError:
            return False

    def size(self, rel: str) -> int:
        with self.failing_as("reading the size of", rel):
            return os.lstat(self.regular(rel)).st_size if self.is_local else self.fs.size(self.path(rel))

    def open(self, rel: str, mode: str = "rb"):
        """`rel` open for reading (or, with another mode, as fsspec opens it); locally never through a link, and
        only a regular file (a FIFO would block the reader)."""
        if not self.is_local or mode != "rb":
            return self.fs.open(self.path(rel), mode)
        fd = os.open(self.regular(rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # made between the check and the open
            os.close(fd)
            raise Planted(f"{self.path(rel)} is not a regular file, where tokenmill keeps a file of its own: "
                          f"{PLANTED_HINT}")  # fmt: skip
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")

    def list(self, prefix: str = "") -> list[str]:
        """Relative paths of all files under `prefix`, sorted."""
        base = self.path(prefix).rstrip("/") if prefix else self.root
        with self.failing_as("listing", prefix):
            if not self.fs.exists(base):
                return []
            return sorted(p[len(self.root) + 1 :] for p in self.fs.find(base))

    @contextmanager
    def writing(self, rel: str, record: dict | None = None) -> Iterator[Path]:
        """Yield a local path to write `rel` into; it is committed atomically when the block succeeds.
        With `record`, the file's size and sha256 go into `record[rel]` (hashed locally, just written, before
        it is committed: see `commits`). A full or failing disk raises `StorageError` naming `rel`, and
        nothing of the file is left under its name."""
        if self.is_local:
            final = Path(self.path(rel))  # replaced by the rename below where it is a link: never written through
            with self._disk_errors(rel):
                self._make_directories(posixpath.dirname(inside(rel)))
            tmp = final.with_name(f".{final.name}{UNFINISHED}{uuid.uuid4().hex[:8]}")
            try:
                with self._disk_errors(rel):
                    yield tmp
                    if record is not None:
                        record[rel] = digest_of(tmp)
                    os.replace(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
        else:
            with tempfile.TemporaryDirectory(prefix="tokenmill-") as tmpdir:
                tmp = Path(tmpdir) / Path(rel).name
                with self._disk_errors(rel, "writing the local copy of"):
                    yield tmp
                if record is not None:
                    record[rel] = digest_of(tmp)
                with self.failing_as("uploading", rel):
                    self.fs.put_file(str(tmp), self.path(rel))

    @contextmanager
    def writing_file(self, rel: str, record: dict, *, read_again: bool = True) -> Iterator[HashingFile]:
        """`writing`, for a file written in large pieces: yield it open, and record its size and sha256 from the
        pieces as they go in rather than reading it back (for the token files, a second pass over every byte).
        `read_again=False`, for a file nothing in the run reads whole again: locally, written past the page cache
        (`UncachedFile`)."""
        uncached = self.is_local and not read_again
        with self.writing(rel) as tmp, UncachedFile(tmp) if uncached else open(tmp, "wb") as f:
            written = HashingFile(f)
            yield written
        record[rel] = written.digest()

    @contextmanager
    def _disk_errors(self, rel: str, action: str = "writing") -> Iterator[None]:
        try:
            yield
        except OSError as e:
            if e.errno not in DISK_ERRORS or isinstance(e, StorageError):
                raise
            reason = f"{e.strerror} ({errno.errorcode.get(e.errno, e.errno)})"
            raise StorageError(f"{action} {self.url_of(rel)} failed: {reason}") from e

    @contextmanager
    def local_copies(self, *rels: str) -> Iterator[list[Path]]:
        """Local paths holding `rels` for reading (the files themselves when the store is local)."""
        if self.is_local:
            yield [Path(self.regular(rel)) for rel in rels]
            return
        with tempfile.TemporaryDirectory(prefix="tokenmill-") as tmpdir:
            paths = [Path(tmpdir) / f"{i}-{Path(rel).name}" for i, rel in enumerate(rels)]
            for rel, path in zip(rels, paths, strict=True):
                with self.failing_as("downloading", rel):
                    self.fs.get_file(self.path(rel), str(path))
            yield paths

    def read_bytes(self, rel: str) -> bytes:
        """The whole file; from an object store in one GET (an open object asks its size first, a HEAD, and s3fs's
        `cat_file` does too where it may read in concurrent parts): a marker, a plan or LATEST is one request."""
        with self.failing_as("reading", rel):
            if not self.is_local:
                return read_object(self.fs, self.path(rel))
            with self.open(rel) as f:
                return f.read()

    def write_bytes(self, rel: str, data: bytes, record: dict | None = None) -> None:
        with self.writing(rel, record) as tmp:
            tmp.write_bytes(data)

    def write_json(self, rel: str, obj, items: Iterable | None = None) -> None:
        """`obj` as indented JSON, keys sorted. `items`: the elements of a list that grows with the shards, written
        one at a time where `obj` holds `STREAMED` (or is it), so that neither they nor the text are held whole
        (a 490,000-file manifest: 122 MB of text, 0.5 GB as a dict per file); the bytes are those of the whole."""
        # orjson: the standard library's indented encoder is pure Python and holds every piece of the text as a
        # string until it joins them (a 490,000-file manifest of 122 MB: 0.7 GB more memory and 3.8 s, not 0.1 GB
        # and 0.2 s)
        text = orjson.dumps(obj, option=JSON_OPTIONS | orjson.OPT_APPEND_NEWLINE)
        if items is None:
            self.write_bytes(rel, text)
            return
        head, tail = text.split(orjson.dumps(STREAMED))  # raises unless it is there once
        line = head[head.rfind(b"\n") + 1 :]  # the list's first line, indented as deep as the list
        depth = len(line) - len(line.lstrip(b" "))
        inner, opening = b"\n" + b" " * (depth + 2), b"["
        with self.writing(rel) as tmp, open(tmp, "wb") as f:
            f.write(head)
            for item in items:  # as orjson indents a list: each element on its own lines, one level in
                f.write(opening + inner + orjson.dumps(item, option=JSON_OPTIONS).replace(b"\n", inner))
                opening = b","
            f.write(b"[]" if opening == b"[" else b"\n" + b" " * depth + b"]")
            f.write(tail)

    def read_json(self, rel: str):
        return orjson.loads(self.read_bytes(rel))

    def put(self, local: str | Path, rel: str) -> None:
        """Copy a local file into the store atomically."""
        with self.writing(rel) as tmp:
            shutil.copyfile(local, tmp)

    def copy(self, source: str, rel: str, digest: dict, record: dict) -> None:
        """`rel` made of the bytes of `source` (whose size and sha256 are `digest`, recorded for `rel` in `record`):
        a hard link locally, free, and safe, since every writer replaces a file and never edits it; a copy inside
        the store, server-side, on an object store."""
        if self.is_local:
            with self.writing(rel) as tmp:
                link_or_copy(self.regular(source), tmp)
        else:
            with self.failing_as("copying", rel):
                server_side_copy(self.fs, self.path(source), self.path(rel), digest["bytes"])
        record[rel] = digest

    def read_ranges(self, rel: str, spans: list[tuple[int, int]]) -> list[bytes]:
        """The bytes from `start` to `end` of the file for each span: locally from one open; on an object store by
        concurrent ranged GETs, spans less than RANGE_GAP apart one GET (an open file would read ahead megabytes
        around each span; reading a few documents of a shard must not read the shard)."""
        wanted = [(start, end) for start, end in spans if end > start]
        if not wanted:
            return [b""] * len(spans)
        with self.failing_as("reading", rel):
            if self.is_local:
                with self.open(rel) as f:
                    return [os.pread(f.fileno(), end - start, start) if end > start else b"" for start, end in spans]
            path = self.path(rel)
            _, starts, ends = merge_offset_ranges(
                [path] * len(wanted), [start for start, _ in wanted], [end for _, end in wanted], max_gap=RANGE_GAP
            )
            blocks = self.fs.cat_ranges([path] * len(starts), starts, ends, on_error="raise")
        found = []
        for start, end in spans:
            at = bisect.bisect_right(starts, start) - 1
            found.append(blocks[at][start - starts[at] : end - starts[at]] if end > start else b"")
        return found

    def sha256(self, rel: str) -> str:
        with self.failing_as("reading", rel), self.open(rel) as f:
            return sha256_of(f)

    def digest(self, rel: str, stamped: bool = False) -> dict:
        """The file's size and sha256, as commit markers and manifests record them, from one open: an object
        store's HEAD, then its GETs (asking whether it exists, then its size, took two HEADs more). A missing file
        is FileNotFoundError; locally a link or a special file in its place, `Planted`. `stamped`: with the stamp
        of the bytes read (`stamp`), taken before them from the same open, so that a change while they are read
        leaves another stamp; None for a local file changed less than a second ago, as a change within the file
        system's clock tick after it would keep its modification time (git's "racy" files)."""
        if stamped and not self.is_local:
            self.fs.invalidate_cache(self.path(rel))  # the open's HEAD, not a listing's
        with self.failing_as("reading", rel), self.open(rel) as f:
            if self.is_local:
                status = os.fstat(f.fileno())
                size, stamp = status.st_size, local_stamp(status)
                if time.time_ns() - status.st_mtime_ns < 1_000_000_000:
                    stamp = None
            else:
                size, stamp = f.size, object_stamp(f.details)
            found = {"bytes": size, "sha256": sha256_of(f)}
        return found | {"stamp": stamp} if stamped else found

    def stamp(self, rel: str) -> dict | None:
        """The file's stamp without reading it (`local_stamp`, `object_stamp`): an `lstat`, or an object store's
        HEAD. None where there is no regular file (missing, or a link in its place or on its way)."""
        with self.failing_as("reading", rel):
            try:
                path = self.path(rel)
                if self.is_local:
                    return local_stamp(os.lstat(path))
                self.fs.invalidate_cache(path)  # what the store says now, not a listing made earlier
                return object_stamp(self.fs.info(path))
            except (FileNotFoundError, Planted):
                return None

    def remove(self, rel: str) -> None:
        """Remove the file `rel` (locally a link there is removed itself, not what it points at)."""
        if self.exists(rel):
            with self.failing_as("removing", rel):
                os.unlink(self.path(rel)) if self.is_local else self.fs.rm(self.path(rel))

    def move(self, rel: str, to: str, size: int | None = None) -> None:
        """Rename `rel` to `to`; on an object store a copy inside the store (`server_side_copy`, `size` its bytes
        where known), then a delete."""
        with self.failing_as("moving", rel):
            if self.is_local:
                self._make_directories(posixpath.dirname(inside(to) or ""))
                os.replace(self.path(rel), self.path(to))
            else:
                server_side_copy(self.fs, self.path(rel), self.path(to), size)
                self.fs.rm_file(self.path(rel))

    def move_all(self, names: dict[str, str], sizes: dict[str, int] | None = None) -> None:
        """Rename files (old name -> new name) where a new name may be another file's old one: a file moves once
        the file under its new name has moved away; a cycle goes round through a temporary name. `sizes`: their
        bytes by old name, where known."""
        pending = {rel: to for rel, to in names.items() if rel != to}
        sizes = dict(sizes or {})
        while pending:
            ready = [rel for rel, to in pending.items() if to not in pending]
            if not ready:
                rel = next(iter(pending))
                self.move(rel, f"{rel}.moving", sizes.get(rel))
                pending[f"{rel}.moving"], sizes[f"{rel}.moving"] = pending.pop(rel), sizes.get(rel)
                continue
            for rel in ready:
                self.move(rel, pending.pop(rel), sizes.get(rel))

    def remove_unfinished(self) -> list[str]:
        """Remove what writes cut short by a killed process left behind (the local temporary files of
        `writing`; an upload to an object store appears whole or not at all). Returns their paths."""
        if not self.is_local:
            return []
        litter = [p for p in Path(self.root).rglob(f".*{UNFINISHED}*") if p.is_file()]
        for path in litter:
            path.unlink(missing_ok=True)
        return [str(p.relative_to(self.root)) for p in litter]

    def remove_tree(self, prefix: str) -> None:
        """Remove every file under `prefix`."""
        if self.exists(prefix):
            with self.failing_as("removing", prefix):
                path = self.path(prefix)
                if not self.is_local:
                    self.fs.rm(path, recursive=True)
                elif stat.S_ISDIR(os.lstat(path).st_mode):
                    shutil.rmtree(path)  # removes the links inside, never what they point at
                else:
                    os.unlink(path)


def sha256_of(f) -> str:
    digest = hashlib.sha256()
    while chunk := f.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


class HashingFile:
    """A binary file being written that keeps the size and sha256 of what is written to it."""

    def __init__(self, file: BinaryIO):
        self.file, self.sha256, self.bytes = file, hashlib.sha256(), 0

    def write(self, data) -> int:
        # Written, then hashed: where `data` is a memory map, the kernel's copy faults its pages in; hashing first
        # faulted them from user space, at times for three times the kernel's time.
        written = self.file.write(data)
        self.sha256.update(data)
        self.bytes += memoryview(data).nbytes
        return written

    def digest(self) -> dict:
        return {"bytes": self.bytes, "sha256": self.sha256.hexdigest()}


def read_object(fs, path: str, most: int | None = None) -> bytes:
    """An object store's object, or its first `most` bytes, in one GET: opening it asks its size first (a HEAD),
    and s3fs's `cat_file` does too where it may read a whole object in concurrent parts."""
    if most is not None:
        return fs.cat_file(path, start=0, end=most)
    return fs.cat_file(path, **({"max_concurrency": 1} if "s3" in fs.protocol else {}))


# What s3fs copies with one CopyObject; a larger object it copies in parts (`S3FileSystem.cp_file`)
S3_PLAIN_COPY = 150 << 20


def server_side_copy(fs, source: str, target: str, size: int | None = None) -> None:
    """The object `source` copied to `target` inside an object store. Of `size` bytes (known from a marker or a
    manifest) up to S3_PLAIN_COPY on S3, one request: s3fs's `cp_file` asks the size first, a HEAD, to choose how
    to copy, and fsspec's `copy` also lists both paths as prefixes."""
    if size is not None and size <= S3_PLAIN_COPY and "s3" in fs.protocol:
        (bucket, key, _), (to_bucket, to_key, _) = fs.split_path(source), fs.split_path(target)
        fs.call_s3("copy_object", Bucket=to_bucket, Key=to_key, CopySource={"Bucket": bucket, "Key": key})
        fs.invalidate_cache(target)
    else:
        fs.cp_file(source, target)


def link_or_copy(source: str | Path, target: Path) -> None:
    """`target` a hard link to the local file `source` (free, and safe: every writer replaces a file, never edits
    it), or a copy where the file system has no hard links."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def digest_of(path: Path) -> dict:
    """A local file's size and sha256, as commit markers record them."""
    with open(path, "rb") as f:
        return {"bytes": os.fstat(f.fileno()).st_size, "sha256": sha256_of(f)}


HASH_THREADS = 8  # files hashed at once: all cores locally, and overlapping requests on object stores


def threads_for(*stores: Store) -> int:
    """Threads for per-file work on these stores: HASH_THREADS where one is an object store (threads overlap its
    requests); one on local disks, where the work is the interpreter's and threads only contend for it (8 threads
    took 1.6x the time reading 196,352 commit markers, and 2.5x linking 490,886 files into a version)."""
    return 1 if all(store.is_local for store in stores) else HASH_THREADS


def threaded(work: Callable, items: Iterable, threads: int = HASH_THREADS) -> Iterator:
    """`work` over `items` on `threads` threads (one: in this one), results in order, a few per thread submitted
    ahead (`Executor.map` submits every item at once: a future each, about 1 KB apiece, 0.5 GB at 500,000 files).
    Each runs in this thread's context (the marker key a worker's task was sent with: `tokenmill.core.signing`)."""
    if threads == 1:
        yield from map(work, items)
        return
    context = contextvars.copy_context()
    with ThreadPoolExecutor(threads) as pool:
        pending: deque = deque()
        for item in items:
            if len(pending) == 4 * threads:
                yield pending.popleft().result()
            pending.append(pool.submit(context.copy().run, work, item))
        while pending:
            yield pending.popleft().result()
