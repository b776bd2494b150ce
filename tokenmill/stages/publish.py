"""The publish stage: `manifest.json`, written last, lists every file of the dataset with its size and
sha256, and the counts and packing stats. Its presence is the proof that the dataset is complete."""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import orjson
import pandas as pd

from tokenmill import __version__
from tokenmill.config import TokenmillConfig
from tokenmill.core import layout
from tokenmill.core.commits import read_marker
from tokenmill.core.plan import Plan
from tokenmill.core.stats import ValidationFailed, packing_summary, split_summary
from tokenmill.formats.megatron import token_dtype
from tokenmill.formats.packed import SUFFIXES
from tokenmill.io.storage import STREAMED, Store, link_or_copy, server_side_copy, threaded, threads_for
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo


def shard_file_counts(table: pd.DataFrame) -> pd.Series:
    """How many files the validated stats say each shard has (by shard id): each split's Megatron pair and its
    documents table where it has documents, packed arrays where it has rows, its llm.c files, a conversations'
    split's loss masks (of its tokens, of its packed rows), and the shard's rejects where it has any."""
    conversations = table.supervised_tokens >= 0
    megatron = (3 + conversations) * (table.documents > 0)
    per_row = megatron + (len(SUFFIXES) + conversations) * (table.packed_rows > 0) + table.llmc_files
    per_row += table.trainer_files
    return per_row.groupby(table.shard_id).sum() + (table.rejected.groupby(table.shard_id).first() > 0)


def other_files(store: Store, table: pd.DataFrame, tokenizer: TokenizerInfo | None, mix: bool) -> list[str]:
    """The dataset's files that are no shard's: the plan, the tokenizer (and the chat templates its conversations
    were rendered with), the stats, each split's shuffle index where it has packed rows, the `index.json` of
    litdata's and MDS's layouts where they were written, the fertility report where there is one, and in a mixture
    (`mix`) its files for the trainers, which its mix stage wrote anew. Each by its name: a file is never published
    because it lies in the output (a planted `mix/` or `tokenizer/*.jinja`)."""
    shuffles = [layout.shuffle_file(split) for split, rows in table.groupby("split").packed_rows.sum().items() if rows]
    splits = table.split.unique().tolist()
    indexes = [layout.trainer_index(format, split) for format in layout.INDEXED_TRAINERS for split in splits]
    indexes = filter(store.exists, indexes)
    fertility = filter(store.exists, layout.FERTILITY_REPORT)
    templates = [layout.chat_template_file(source) for source, _ in tokenizer.chat] if tokenizer else []
    others = [layout.PLAN, layout.TOKENIZER, *templates, layout.STATS, *shuffles, *indexes, *fertility]
    return [*others, *store.list(layout.MIX)] if mix else others


def chat_templates(tokenizer: TokenizerInfo) -> dict:
    """The manifest's record of each chat input's template (by source; "" for a single input): its file in the
    dataset, where it came from, its digest, the end-of-turn found in it and the date it writes."""
    return {
        source: {
            "path": layout.chat_template_file(source),
            "from": template.name,
            "digest": template.digest(),
            "end_of_turn": template.end_of_turn,
            "date": None if template.today is None else template.today.isoformat(),
        }
        for source, template in tokenizer.chat
    }


def encoder_entry(store: Store) -> dict:
    """The run's encoder backend and version, as the tokenize stage chose it (absent for older outputs)."""
    if not store.exists(layout.ENCODER_CHOICE):
        return {}
    choice = store.read_json(layout.ENCODER_CHOICE)
    entry = {"name": choice["backend"], **{k: choice[k] for k in ("version", "reason", "unsafe")}}
    if store.exists(layout.REFERENCE_CHECK):  # validate's re-encoded sample: documents, mismatches, allowed rate
        entry["reference_check"] = store.read_json(layout.REFERENCE_CHECK)
    return {"encoder": entry}


def dataset_version(config: TokenmillConfig, plan: Plan, tokenizer: TokenizerInfo) -> str:
    """The published version's name: `output.publish.version`, else a hash of everything the dataset's bytes
    depend on: the config, the input files' fingerprints, the tokenizer, and the shards' layout (which shard
    holds which pieces, a function of the input set and the shard size), so a changed input is a new version
    and a version's name always means the same bytes."""
    if config.output.publish.version:
        return config.output.publish.version
    layout = [[s.shard_id, s.source] for s in plan.shards]
    templates = [template.digest() for _, template in tokenizer.chat]  # a changed chat template: a new version
    made_from = json.dumps([config.dataset_hash(), plan.inputs, tokenizer.sha256, layout, *templates])
    return hashlib.sha256(made_from.encode()).hexdigest()[:16]


def version_store(config: TokenmillConfig, version: str) -> Store:
    root = config.publish_root()
    return Store(f"{root.url}/{version}", root.storage_options)


class VersionConflict(Exception):
    """`output.publish.version` names a version already published from another input or config."""


def already_published(config: TokenmillConfig, plan: Plan, tokenizer: TokenizerInfo) -> dict | None:
    """The manifest of this dataset's version if it is published complete (its manifest is written last), so
    a run over an unchanged input has nothing to do, less its list of files (`manifest_less_files`); None if it
    is not. Raises VersionConflict if a version of that name holds another dataset."""
    version = dataset_version(config, plan, tokenizer)
    target = version_store(config, version)
    if not target.exists(layout.MANIFEST):
        return None
    manifest = manifest_less_files(target)
    published = {
        "input": manifest.get("inputs", {}).get("hash"),
        "config": manifest.get("dataset_hash"),
        "tokenizer": manifest["tokenizer"]["sha256"],
    }
    now = {"input": plan.inputs, "config": config.dataset_hash(), "tokenizer": tokenizer.sha256}
    if differs := [what for what in now if published[what] != now[what]]:
        raise VersionConflict(
            f"{target.url} was published from another {' and '.join(differs)}; nothing was overwritten. Name a new "
            "output.publish.version, or leave it null for a version named after what it holds"
        )
    return manifest


FILES_LISTED = "files_listed"  # how many files the list `manifest_less_files` leaves out held


def manifest_less_files(store: Store) -> dict:
    """The store's manifest without its list of files, whose entries are counted (`FILES_LISTED`) as the text is
    read a line at a time: as dicts, a 490,000-file manifest was about 0.4 GB. The list is found as `write_json`
    writes it (its key two spaces in, an entry per four); a manifest laid out otherwise is read whole."""
    kept, files, skipping = [], 0, False
    with store.failing_as("reading", layout.MANIFEST), store.open(layout.MANIFEST) as f:
        for line in f:
            if skipping:
                if line.startswith(b"  ]"):
                    kept.append(b'  "files": []' + line[3:])
                    skipping = False
                else:
                    files += line == b"    {\n"
            elif line == b'  "files": [\n':
                skipping = True
            else:
                kept.append(line)
    try:
        manifest = orjson.loads(b"".join(kept))
    except orjson.JSONDecodeError:
        manifest = store.read_json(layout.MANIFEST)
    listed = manifest.pop("files", None)
    return {**manifest, FILES_LISTED: len(listed) if listed else files}


def lineage(config: TokenmillConfig, version: str, inputs: list[dict], sources: dict[str, str]) -> dict:
    """What this version was built from: the version LATEST named before it, and against that version's
    manifest the input files added, changed and removed, and the shards kept (made from the same pieces of
    the same file versions, so their files are the same) or made anew. Derived from the two versions' contents,
    so it is the same however many retries or reruns made the new one."""
    root = config.publish_root()
    previous = latest_version(root)
    before = version_store(config, previous) if previous and previous != version else None
    if before is None or not before.exists(layout.MANIFEST):
        return {"previous_version": None, "shards_kept": 0, "shards_made": len(sources)}
    old = before.read_json(layout.MANIFEST)
    kept = set(old.get("shard_sources", {}).values()) & set(sources.values())
    return {
        "previous_version": previous,
        **{f"inputs_{k}": len(v) for k, v in input_changes(old.get("inputs", {}).get("files", []), inputs).items()},
        "shards_kept": len(kept),
        "shards_made": len(sources) - len(kept),
    }


def input_changes(old: list[dict], new: list[dict]) -> dict[str, list[str]]:
    """The input files added, changed (another size, ETag or mtime) and removed between two file lists."""
    before, after = {f["path"]: f for f in old}, {f["path"]: f for f in new}
    return {
        "added": sorted(after.keys() - before.keys()),
        "changed": sorted(p for p in after.keys() & before.keys() if after[p] != before[p]),
        "removed": sorted(before.keys() - after.keys()),
    }


class Files:
    """The manifest's files, in path order, spooled to this machine's disk as they are listed: a file of lines per
    spool, each written in path order, merged as they are read (`entries`), so that the list costs the same memory
    at any size. Held in memory, 490,886 files were a 38 MB table, and 100 MB more of peak while it was made and
    put in order: publish's peak grew with the shards. A context manager: the spool goes on exit."""

    def __init__(self):
        self.directory = tempfile.TemporaryDirectory(prefix="tokenmill-files-")
        self.spools: dict[str, BinaryIO] = {}
        self.last: dict[str, str] = {}  # each spool's last path
        self.count = 0

    def add(self, spool: str, path: str, digest: dict) -> None:
        """A file (its `{"bytes", "sha256"}`), after every other file of `spool` in path order."""
        if path <= self.last.get(spool, ""):
            raise RuntimeError(f"publish listed {path} after {self.last[spool]} (spool {spool!r}): a tokenmill bug")
        if spool not in self.spools:
            self.spools[spool] = open(os.path.join(self.directory.name, str(len(self.spools))), "wb")  # noqa: SIM115
        self.spools[spool].write(orjson.dumps([path, digest["bytes"], digest["sha256"]]) + b"\n")
        self.last[spool] = path
        self.count += 1

    def __len__(self) -> int:
        return self.count

    def entries(self) -> Iterator[dict]:
        """Each file's `{"path", "bytes", "sha256"}`, in path order (lists compare by their first item, the path)."""
        for f in self.spools.values():
            f.flush()
        for path, size, sha256 in heapq.merge(*map(self._read, self.spools.values())):
            yield {"path": path, "bytes": size, "sha256": sha256}

    @staticmethod
    def _read(spool: BinaryIO) -> Iterator[list]:
        with open(spool.name, "rb") as f:
            yield from map(orjson.loads, f)

    def __enter__(self) -> Files:
        return self

    def __exit__(self, *exc) -> None:
        for f in self.spools.values():
            f.close()
        self.directory.cleanup()


def latest_version(root: Store) -> str | None:
    """The version LATEST names, if any (a name of a directory beside it: a planted LATEST naming a path elsewhere
    stops the run, `Planted`)."""
    if not root.exists(layout.LATEST):
        return None
    return root.stored_name(root.read_bytes(layout.LATEST).decode().strip(), layout.LATEST) or None


def spool_files(
    store: Store, table: pd.DataFrame, files: Files, tokenizer: TokenizerInfo | None = None, mix: bool = False
) -> None:
    """Add the manifest's files to `files`, with their sizes and sha256: each shard's as its tokenize and pack commit
    markers recorded them (hashed as they were written, and checked again whenever a marker is reused: publish need
    not read the dataset's bytes again, which on a grown input would be all of them every night), which must be as
    many as the validated stats name, and the dataset's other files (`other_files`), hashed here. The shards are
    read in the order of their names, so that each directory's files come in path order. `tokenizer`: the run's (its
    chat templates are published); `mix`: whether the run is a mixture (its `mix/` is published)."""
    shards = shard_file_counts(table)
    shards = shards.iloc[np.argsort([layout.shard_name(i) for i in shards.index], kind="stable")]
    stages = ("tokenize", "pack")

    def recorded(stage_and_shard: tuple[str, int]) -> dict:
        done = read_marker(store, *stage_and_shard)
        return {} if done is None else done["files"]

    counts = np.zeros(len(shards), np.int64)
    markers = ((stage, shard_id) for shard_id in shards.index for stage in stages)
    for index, recorded_files in enumerate(threaded(recorded, markers, threads_for(store))):
        for rel, digest in sorted(recorded_files.items()):
            files.add(os.path.dirname(rel), rel, digest)
        counts[index // len(stages)] += len(recorded_files)
    if len(wrong := sorted(np.flatnonzero(counts != shards.to_numpy()), key=lambda i: shards.index[i])):
        named = ", ".join(f"shard {shards.index[i]:05d} ({counts[i]} files recorded, {shards.iloc[i]} in the stats)"
                          for i in wrong[:10])  # fmt: skip
        raise ValidationFailed(
            f"the commit markers of {len(wrong)} shards do not list the files the validated stats name: {named}; "
            "nothing was published; `tokenmill rerun OUTPUT --shard N` redoes a shard"
        )
    others = sorted(other_files(store, table, tokenizer, mix))
    for rel, digest in zip(others, threaded(store.digest, others), strict=True):  # hashlib releases the GIL
        files.add("", rel, digest)


def manifest_entries(files: Files) -> Iterator[dict]:
    """The manifest's entry for each file of `files`, made as they are written."""
    for file in files.entries():
        yield {**file, **layout.describe(file["path"])}


def publish(
    config: TokenmillConfig,
    plan: Plan,
    tokenizer: TokenizerInfo,
    table: pd.DataFrame,
    files: Files,
    mix: dict | None = None,
) -> dict:
    """Write `manifest.json` for the validated dataset, its list of files spooled into `files` (`spool_files`, kept for
    `publish_version`) and written an entry at a time, never held as a dict per file (with the text, about 10 KB per
    shard); return the manifest without that list. `mix`: a mixture's, resolved (tokenmill.stages.mix)."""
    store = config.output.store()
    shard_rows = table.drop_duplicates("shard_id")
    spool_files(store, table, files, tokenizer, mix is not None)
    version = dataset_version(config, plan, tokenizer)
    sources = {str(s.shard_id): s.source for s in plan.shards}
    manifest = {
        "name": config.name,
        "version": version,
        "tokenmill_version": __version__,
        "dataset_hash": config.dataset_hash(),
        "inputs": {"hash": plan.inputs, "files": plan.files},
        "lineage": lineage(config, version, plan.files, sources),
        "shard_sources": sources,
        "config": config.dataset_config(),
        "tokenizer": {
            "path": layout.TOKENIZER,
            "sha256": tokenizer.sha256,
            "vocab_size": tokenizer.vocab_size,
            "eod_id": tokenizer.eod_id,
            "bos_id": tokenizer.bos_id,
            "pad_id": tokenizer.pad_id,
            "trained": tokenizer.trained,
            **({"chat_templates": chat_templates(tokenizer)} if tokenizer.chat else {}),
        },
        **encoder_entry(store),
        "dtype": token_dtype(tokenizer.vocab_size).name,
        "shards": int(len(shard_rows)),
        "counts": {
            "documents_in": int(shard_rows.documents_in.sum()),
            "documents_out": int(table.documents.sum()),
            "documents_rejected": int(shard_rows.rejected.sum()),
            "tokens": int(table.tokens.sum()),
        },
        "splits": split_summary(table, config.pack.seq_len),
        "packing": packing_summary(table.sum(numeric_only=True), config.pack.seq_len),
        **({"mix": mix} if mix is not None else {}),
    }
    store.write_json(layout.MANIFEST, {**manifest, "files": STREAMED}, manifest_entries(files))
    return manifest


def publish_version(config: TokenmillConfig, manifest: dict, files: Files, extra_files: list[str] = ()) -> dict:
    """Copy the dataset to `<publish path>/<name>/<version>/`, then its manifest, then point LATEST at it.

    A file already there with the manifest's size and sha256 is not copied again, so publishing twice
    copies nothing and a publish interrupted halfway (no manifest yet) is completed by the next one.
    Locally files are hard-linked where possible; between two object stores they are copied server-side.
    """
    source, root = config.output.store(), config.publish_root()
    own_directories(config, manifest["version"])
    target = version_store(config, manifest["version"])
    target.remove_unfinished()  # a publish killed mid-copy leaves a temporary file beside the ones it finished

    # On an object store, which files are there at all from one listing: asking for a missing object costs a HEAD
    # and a listing of its own
    there = None if target.is_local else set(target.list())

    def publish_file(entry: dict) -> bool:
        if (there is None or entry["path"] in there) and _already_there(source, target, entry):
            return False
        _copy(source, target, entry["path"], entry["bytes"])
        return True

    copied = sum(threaded(publish_file, files.entries(), threads_for(source, target)))
    skipped = len(files) - copied
    for rel in extra_files:  # the report, a single input's Megatron data-args: small, not part of the data
        _copy(source, target, rel)
    _copy(source, target, layout.MANIFEST)  # the build's, as publish wrote it
    root.write_bytes(layout.LATEST, f"{manifest['version']}\n".encode())
    deleted = prune_versions(config)
    return {"url": target.url, "version": manifest["version"], "copied": copied, "skipped": skipped, "deleted": deleted}


def own_directories(config: TokenmillConfig, version: str) -> None:
    """The dataset's directory and its version's, in a publish location others may write, made where missing and
    checked: never a link planted there (`Planted`), which would have the version written elsewhere."""
    base = Store(config.output.publish.path or config.output.path, config.output.publish.storage.fsspec_options())
    base.make_directories(f"{config.name}/{version}")


def point_latest_at(config: TokenmillConfig, manifest: dict) -> dict:
    """A version already published complete: make LATEST name it (if it does not already), copying nothing."""
    own_directories(config, manifest["version"])
    root = config.publish_root()
    if not root.exists(layout.LATEST) or root.read_bytes(layout.LATEST).decode().strip() != manifest["version"]:
        root.write_bytes(layout.LATEST, f"{manifest['version']}\n".encode())
    url = version_store(config, manifest["version"]).url
    skipped, deleted = manifest[FILES_LISTED], prune_versions(config)
    return {"url": url, "version": manifest["version"], "copied": 0, "skipped": skipped, "deleted": deleted}


def versions_in_lineage(root: Store) -> list[str]:
    """LATEST's version, the one it was built from, and so on back (newest first), as their manifests say."""
    chain: list[str] = []
    version = latest_version(root)
    while version and version not in chain and root.exists(f"{version}/{layout.MANIFEST}"):
        chain.append(version)
        manifest = f"{version}/{layout.MANIFEST}"
        version = root.read_json(manifest).get("lineage", {}).get("previous_version")
        version = version and root.stored_name(version, manifest)
    return chain


def prune_versions(config: TokenmillConfig) -> list[str]:
    """`output.publish.keep_versions`: delete the versions of LATEST's lineage past the newest N, each one's
    manifest first (a half-deleted version is never taken for a complete one), then its files. Every version
    is a directory of its own (hard links locally, copies on object stores), so deleting one never touches a
    file another lists; versions outside the lineage (another config's) are left alone."""
    keep = config.output.publish.keep_versions
    if keep is None:
        return []
    root = config.publish_root()
    old = versions_in_lineage(root)[keep:]
    for version in old:
        root.remove(f"{version}/{layout.MANIFEST}")
        root.remove_tree(version)
    return old


def _already_there(source: Store, target: Store, entry: dict) -> bool:
    rel = entry["path"]
    if not target.is_local:  # one HEAD, then the GETs of its sha256 (`Store.digest`)
        try:
            return target.digest(rel) == {"bytes": entry["bytes"], "sha256": entry["sha256"]}
        except FileNotFoundError:
            return False
    if not target.is_regular(rel):  # missing, or a link planted there: replaced by the copy
        return False
    if target.size(rel) != entry["bytes"]:
        return False
    if source.is_local and os.path.samefile(source.regular(rel), target.regular(rel)):
        return True
    return target.sha256(rel) == entry["sha256"]


def _copy(source: Store, target: Store, rel: str, size: int | None = None) -> None:
    """`rel` of `source` published to `target`; `size`: its bytes, where the manifest knows them."""
    if source.is_local and target.is_local:
        with target.writing(rel) as tmp:
            link_or_copy(source.regular(rel), tmp)  # a link planted in its place is refused, never published
    elif type(source.fs) is type(target.fs) and source.storage_options == target.storage_options:
        server_side_copy(target.fs, source.path(rel), target.path(rel), size)  # nothing through this process
    else:
        with source.local_copies(rel) as (path,):
            target.put(path, rel)
