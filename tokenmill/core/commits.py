"""Shard commit markers: the source of truth for what is done.

A stage writes its shard's files first and its marker last; the marker holds the stage key (a hash of
everything the output depends on), the shard's stats, and the size and sha256 of every file the shard wrote
(hashed locally: the token files as their bytes are written, the others read back right after). A task that
finds a marker with its key, and every file still as recorded, returns those stats at once, so reruns, retries
and Dask's recomputations redo nothing; a file changed or deleted since its commit (a bit flip, a truncation, a stray
`rm`) makes the shard be redone, and the result says why (`redone`). With `output.reuse_check: stamp` the marker
also keeps each file's stamp (its inode, size, modification time and owner; an object's ETag) as of the last time
its bytes were found intact, and a run reads only the files whose stamp changed.

The output location is data others may write: each marker is signed (`signing.marker_signature`, under the key the
workers are sent with their tasks). A shard whose marker is not signed with the user's key (planted, altered, or
written by an older tokenmill or with another key) is redone, its run says so naming the marker, and nothing it
lists is taken, removed or published; one read once the run's shards are done (publish, validate) stops the run.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import orjson

from tokenmill import __version__
from tokenmill.config import TokenmillConfig
from tokenmill.core import layout, signing
from tokenmill.io.storage import PLANTED_HINT, Planted, Store
from tokenmill.stages import COMMITTING
from tokenmill.stages import STAGES as ALL_STAGES
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo

# The stages that commit per shard (`tokenmill.stages`), in the order they run
STAGES = (SCATTER, GATHER, SAMPLE, TOKENIZE, PACK) = COMMITTING
# A shard's files as they are now passed validate's check of them (`validate.check_written`): a marker without files,
# its key made of the tokenize and pack markers. Not a stage's commit: nothing is discarded or moved with it (a shard
# made again, or given another id, has other markers, so another key).
CHECK = "check"
MOVABLE = tuple(name for name in STAGES if ALL_STAGES[name].movable)  # a shard's output can change id


class Commit:
    """What a shard task learns from its marker: the committed result, or why there is none to reuse."""

    def __init__(self, result: dict | None = None, redone: str | None = None):
        self.result, self.redone = result, redone


class Unsigned(Planted):
    """A commit marker not signed with the user's key: nothing it says is taken."""


def read_marker(store: Store, stage: str, shard_id: int) -> dict | None:
    """The shard's marker of `stage` as committed, None if there is none. Every file it lists must be one of this
    shard's own files (named after it, in the dataset's layout) inside the output: tokenmill never writes another, so
    one that names a file elsewhere (`../victim`) or another file of the dataset (its config, its plan) was planted
    by a writer of the output location, and stops the run naming it (`Planted`) before anything is read, removed or
    published through it. It must bear the user's signature (`Unsigned`, naming it, if not)."""
    rel = layout.marker(stage, shard_id)
    try:
        done = store.read_json(rel)  # one open: asking whether it exists first cost an object store a HEAD more
    except FileNotFoundError:
        return None
    files = done.get("files", {}) if isinstance(done, dict) else None
    if not isinstance(files, dict):
        raise Planted(f"{store.url_of(rel)} is not a commit marker tokenmill wrote (no file list): {PLANTED_HINT}")
    for path in files:
        if store.stored_path(path, rel) != path or layout.describe(path)["shard"] != shard_id:
            raise Planted(
                f"{store.url_of(rel)} names {path!r}, which is not a file of shard {shard_id:05d}: {PLANTED_HINT}"
            )
    signature = done.pop("signature", None)
    if not isinstance(signature, str) or not hmac.compare_digest(signature, signing.marker_signature(rel, done)):
        raise Unsigned(
            f"{store.url_of(rel)} is not signed with your tokenmill key ({signing.key_path()}): put there or changed "
            "by someone who can write the output location, or written by an older tokenmill or with another key; "
            "nothing it lists was taken, removed or published"
        )
    return done


def check(store: Store, stage: str, shard_id: int, key: str) -> Commit:
    """The committed result of `stage` for this shard if it was made with `key` and its files are intact;
    else `redone` says what changed, or that its marker is not signed (None when there was no marker at all, or
    one made with another stage key: another config's). Each file is read for its sha256, but where the store
    trusts stamps (`output.reuse_check: stamp`): there a file whose stamp is the one recorded when it was last
    found intact is not read, and the marker records the stamps of the files read."""
    try:
        done = read_marker(store, stage, shard_id)
    except Unsigned as e:
        return Commit(redone=f"{stage} shard {shard_id:05d}: {e}; redoing the shard")
    if done is None:
        return Commit()
    if done.get("key") != key:
        return Commit()
    stamps = done.get("stamps", {}) if store.trusts_stamps else {}
    found: dict[str, dict] = {}  # the stamps of the files as they are now, where one was taken
    for path, recorded in sorted(done.get("files", {}).items()):
        if path in stamps and store.stamp(path) == stamps[path]:  # output.reuse_check: stamp
            found[path] = stamps[path]
            continue
        if (damage := changed(store, path, recorded, found if store.trusts_stamps else None)) is not None:
            return Commit(redone=f"{stage} shard {shard_id:05d}: {path} {damage} since its commit; redoing the shard")
    if found != stamps:  # files read and found intact: their stamps, for the next run
        commit(store, stage, shard_id, key, done["result"], done["files"], stamps=found)
    return Commit(done["result"])


def changed(store: Store, path: str, recorded: dict, stamps: dict | None = None) -> str | None:
    """How a committed file differs from its record: missing, another size, other bytes; None if intact.
    Its size and sha256 come from one read (`Store.digest`: ~1 GB/s locally; an object store's HEAD and GET). A link
    or a special file put in its place is a change (the shard is made again, its file written in place of the link).
    `stamps`: where an intact file's stamp goes (taken as it is read)."""
    try:
        now = store.digest(path, stamped=stamps is not None)
    except FileNotFoundError:
        return "was deleted"
    except Planted:
        return "was replaced by a link or a special file"
    if now["bytes"] != recorded["bytes"]:
        return f"changed size ({now['bytes']} bytes, {recorded['bytes']} committed)"
    if now["sha256"] != recorded["sha256"]:
        return "changed content (sha256 differs)"
    if stamps is not None and now["stamp"] is not None:
        stamps[path] = now["stamp"]
    return None


def committed(store: Store, stage: str, shard_id: int, key: str) -> dict | None:
    """The committed result of `stage` for this shard, if it was made with `key` and its files are intact."""
    return check(store, stage, shard_id, key).result


def commit(
    store: Store, stage: str, shard_id: int, key: str, result: dict, files: dict | None = None,
    stamps: dict | None = None,
) -> dict:  # fmt: skip
    """Write the marker, last: `files` maps each file the shard wrote to its size and sha256 (see
    `Store.writing(rel, record=files)`), signed (`signing.marker_signature`). `stamps`: of files found intact by
    their sha256 (`check`), which a run that trusts stamps takes as intact while their stamps stay the same."""
    rel = layout.marker(stage, shard_id)
    body = {"key": key, "result": result, "files": files or {}} | ({"stamps": stamps} if stamps else {})
    body = orjson.loads(orjson.dumps(body))  # as it is read back
    store.write_json(rel, body | {"signature": signing.marker_signature(rel, body)})
    return result


def trusted_marker(store: Store, stage: str, shard_id: int) -> dict | None:
    """`read_marker`, but None for one not signed with the user's key: for removing a shard's files, which then are
    left (they are no file of a shard any more, never published) rather than removed on a planted marker's word."""
    try:
        return read_marker(store, stage, shard_id)
    except Unsigned:
        return None


def discard(store: Store, shard_ids: list[int]) -> None:
    """Remove what the shards committed in every stage, files first, markers last: their ids now name other
    shards (or none), and a reader of the build directory must not find an old shard's file beside them."""
    for stage in STAGES:
        for shard_id in shard_ids:
            if (done := trusted_marker(store, stage, shard_id)) is not None:
                for path in done["files"]:
                    store.remove(path)
            store.remove(layout.marker(stage, shard_id))


def lift(store: Store, moves: dict[int, int]) -> list[tuple[str, int, int, dict]]:
    """The first half of giving shards new ids (`moves`: old id -> new id): take their markers away, so that no
    task takes their files for the shards their old ids now name, and return the movable ones for `land`. The
    other stages' outputs are made again."""
    lifted = []
    for stage in STAGES:
        for old, new in moves.items():
            if (done := trusted_marker(store, stage, old)) is not None and stage in MOVABLE:
                lifted.append((stage, old, new, done))
            store.remove(layout.marker(stage, old))
    return lifted


def land(store: Store, lifted: list[tuple[str, int, int, dict]]) -> None:
    """The second half: rename the lifted shards' files to their new ids and commit them there, with their stamps
    (`check`). A shard with a file missing is left uncommitted (its next task makes it again); so is every shard if
    this never runs."""
    whole = [(stage, old, new, done) for stage, old, new, done in lifted if all(map(store.exists, done["files"]))]
    names = {rel: layout.renumbered(rel, old, new) for _, old, new, done in whole for rel in done["files"]}
    store.move_all(names, {rel: recorded["bytes"] for *_, done in whole for rel, recorded in done["files"].items()})
    for stage, _, new, done in whole:
        files = {names[rel]: recorded for rel, recorded in done["files"].items()}
        # A rename keeps what a local stamp holds; an object store's move is a copy, whose ETag may differ (then read)
        stamps = {names[rel]: stamp for rel, stamp in done.get("stamps", {}).items() if rel in names}
        commit(store, stage, new, done["key"], done["result"] | {"shard_id": new}, files, stamps)


def tokenize_key(config: TokenmillConfig, tokenizer: TokenizerInfo) -> str:
    """The run's part of each shard's tokenize key (`shard_key`): what a shard's tokens depend on besides what it
    is made from: the config, the tokenizer, tokenmill; not its id or the run that made it."""
    config_part = config.section_hash("input", "partition", "split", "tokenizer", checks=False)
    templates = "".join(f"-{template.digest()}" for _, template in tokenizer.chat)  # a changed template: new tokens
    return f"{config_part}-{tokenizer.sha256[:16]}{templates}-{__version__}"


def pack_key(config: TokenmillConfig) -> str:
    """The run's part of each shard's pack key beyond its tokens (`shard_key`): the pack config and the formats."""
    # The formats and llm.c cap change what this stage writes; output.path does not (a moved dataset is reused).
    formats = json.dumps([config.output.formats, config.output.llmc_shard_tokens]).encode()
    return f"{config.section_hash('pack')}-{hashlib.sha256(formats).hexdigest()[:8]}"


def shard_key(tokenize: str, source: str, pack: str | None = None) -> str:
    """A shard's tokenize key (its pack key with `pack`): the run's parts (`tokenize_key`, `pack_key`) and what the
    shard is made from (`source`: its pieces and their files' fingerprints)."""
    return f"{tokenize}-{source}" if pack is None else f"{tokenize}-{source}-{pack}"
