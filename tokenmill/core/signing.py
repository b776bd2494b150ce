"""What tokenmill stores in an output location, recognised as its user's own: an HMAC-SHA256 of the file's name and
bytes under a key that only that user (or the team that shares it) can read, beside the file (`<file>.hmac`).

The output location is data others may write (a group-writable project directory, a shared bucket). A rerun given
only that location takes the run's config from there (`tokenmill.commands.runs`): unsigned, or signed with another key,
it is refused, naming the file, so a planted config cannot make a rerun read the user's files into the bucket. The
plan's cuts of large files are reused as they are only from a plan so signed (`tokenmill.stages.partition`); others' are
found again first.

The key: `$TOKENMILL_HOME/state-key` (default `~/.tokenmill/state-key`), 32 random bytes made on first use (mode
0600, in a directory of mode 0700). A team that reruns each other's outputs shares one: a file its group can read,
named by `TOKENMILL_STATE_KEY` (infra/ mounts it from a Secret). A key others can write, or anyone can read, is
refused; a named key that is missing stops the run (it is never made).

Commit markers (`tokenmill.core.commits`) are written and read where the shards run, on Dask workers that may run on
other hosts, as another user, with no such file. They are signed with a key derived from the state key
(`marker_key`), which the flow sends with each task it gives the cluster (`tokenmill.core.tries.Sealed`, over the
cluster's TLS); a worker that holds it can sign markers, not the stored config or plan.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import orjson

from tokenmill.io.storage import Store

KEY_ENV = "TOKENMILL_STATE_KEY"
SUFFIX = ".hmac"


def key_path() -> Path:
    if named := os.environ.get(KEY_ENV):
        return Path(named).expanduser()
    return Path(os.environ.get("TOKENMILL_HOME", "~/.tokenmill")).expanduser() / "state-key"


MIN_KEY_BYTES = 16
MAKE_ONE = "openssl rand -hex 32"  # what `state_key` writes: 32 random bytes as hex


def state_key() -> bytes:
    """The key, made on first use where none is named (`KEY_ENV`). A named key is never made: where it is missing
    (a Secret that is not mounted, a path mistyped), a new key would have each shard of the user's outputs made
    again and their reruns without `--config` refused, so the run stops, naming the file."""
    path = key_path()
    if not os.environ.get(KEY_ENV) and not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:  # made by another process meanwhile: its key is the one
            pass
        else:
            with os.fdopen(descriptor, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
    try:
        found = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no such file, and {KEY_ENV} names it as the key tokenmill signs what it stores in an output "
            f"with; tokenmill makes no key where one is named (with a new one, your outputs' shards would all be made "
            f"again). Put your team's key there, or a new one (`(umask 077; {MAKE_ONE} > {path})`); in infra/, the "
            f"Secret tokenmill-state-key (Kubernetes) or TOKENMILL_STATE_KEY_HEX (compose): infra/README.md"
        ) from None
    if found.st_mode & 0o022 or found.st_mode & 0o004 or found.st_uid not in (os.getuid(), 0):
        raise PermissionError(
            f"{path}: the key tokenmill signs its stored state with must be readable by you (or your group) only, "
            f"and writable by its owner only (it is mode {stat.S_IMODE(found.st_mode):o}, uid {found.st_uid})"
        )
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"{path}: not a tokenmill key: it must hold at least {MIN_KEY_BYTES} random bytes written in hex "
            f"(`{MAKE_ONE}`), and holds {len(text)} characters{'' if key or not text else ' that are not hex'}"
        )
    return key


def signature(rel: str, data: bytes) -> str:
    return hmac.new(state_key(), rel.encode() + b"\0" + data, hashlib.sha256).hexdigest()


def write_signed(store: Store, rel: str, data: bytes) -> None:
    """`data` written as `rel`, then its signature beside it."""
    store.write_bytes(rel, data)
    store.write_bytes(rel + SUFFIX, signature(rel, data).encode())


def signed(store: Store, rel: str, data: bytes) -> bool:
    """Whether `data`, read from `rel`, bears this user's signature."""
    if not store.exists(rel + SUFFIX):
        return False
    return hmac.compare_digest(store.read_bytes(rel + SUFFIX).decode(errors="replace").strip(), signature(rel, data))


# The marker key a task was sent with (`with_marker_key`); unset in the flow's own process, which derives it.
DELIVERED: ContextVar[bytes | None] = ContextVar("tokenmill_marker_key", default=None)
_derived: dict[Path, bytes] = {}  # per key file: the flow reads a marker per shard and stage


def marker_key() -> bytes:
    """The key commit markers are signed with: the one this task was sent with, else derived from the state key (an
    HMAC of a fixed label: who learns it, a worker, cannot sign a config or a plan)."""
    if (delivered := DELIVERED.get()) is not None:
        return delivered
    path = key_path()
    if path not in _derived:
        _derived[path] = hmac.new(state_key(), b"tokenmill commit markers", hashlib.sha256).digest()
    return _derived[path]


@contextmanager
def with_marker_key(key: bytes | None) -> Iterator[None]:
    """Markers signed and checked with `key` in this thread (and the threads `storage.threaded` starts from it)
    until the block ends; None: as the process would."""
    token = DELIVERED.set(key)
    try:
        yield
    finally:
        DELIVERED.reset(token)


def marker_signature(rel: str, body: dict) -> str:
    """The signature of a marker `rel` holding `body` (its key, result and files), over their JSON with keys sorted
    (as orjson writes and reads it back: the same bytes on both sides)."""
    canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hmac.new(marker_key(), rel.encode() + b"\0" + canonical, hashlib.sha256).hexdigest()
