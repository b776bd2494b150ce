"""What tokenmill stores in an output location, recognised as its user's own: an HMAC-SHA256 of the file's name and
bytes under a key that only that user (or the team that shares it) can read, beside the file (`<file>.hmac`).

The output location is data others may write (a group-writable project directory, a shared bucket). A rerun given
only that location takes the run's config from there (`tokenmill.commands.runs`): unsigned, or signed with another key,
it is refused, naming the file, so a planted config cannot make a rerun read the user's files into the bucket. The
plan's cuts of large files are reused as they are only from a plan so signed (`tokenmill.stages.partition`); others' are
found again first.

The key: `$TOKENMILL_HOME/state-key` (default `~/.tokenmill/state-key`), 32 random bytes made on first use (mode
0600, in a directory of mode 0700). A team that reruns each other's outputs shares one: a file its group can read,
named by `TOKENMILL_STATE_KEY`. A key others can write, or anyone can read, is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from tokenmill.io.storage import Store

KEY_ENV = "TOKENMILL_STATE_KEY"
SUFFIX = ".hmac"


def key_path() -> Path:
    if named := os.environ.get(KEY_ENV):
        return Path(named).expanduser()
    return Path(os.environ.get("TOKENMILL_HOME", "~/.tokenmill")).expanduser() / "state-key"


def state_key() -> bytes:
    """The key, made on first use where none is named (`KEY_ENV`)."""
    path = key_path()
    if not path.exists() and KEY_ENV not in os.environ:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:  # made by another process meanwhile: its key is the one
            pass
        else:
            with os.fdopen(descriptor, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
    found = os.stat(path)
    if found.st_mode & 0o022 or found.st_mode & 0o004 or found.st_uid not in (os.getuid(), 0):
        raise PermissionError(
            f"{path}: the key tokenmill signs its stored state with must be readable by you (or your group) only, "
            f"and writable by its owner only (it is mode {stat.S_IMODE(found.st_mode):o}, uid {found.st_uid})"
        )
    return bytes.fromhex(path.read_text().strip())


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
