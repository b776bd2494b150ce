"""The publish stage: `manifest.json`, written last, lists every file of the dataset with its size and
sha256, and the counts and packing stats. Its presence is the proof that the dataset is complete."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import pandas as pd

from tokenmill import __version__, layout
from tokenmill.config import TokenmillConfig
from tokenmill.formats.megatron import token_dtype
from tokenmill.formats.packed import SUFFIXES
from tokenmill.storage import Store
from tokenmill.tokenize import ENCODER_CHOICE
from tokenmill.tokenizer import TokenizerInfo
from tokenmill.validate import REFERENCE_CHECK

HASH_THREADS = 8  # files hashed at once: all cores locally, and overlapping requests on object stores


def dataset_files(table: pd.DataFrame) -> list[str]:
    """Every file the validated stats say the dataset has, in a stable order."""
    files = [layout.PLAN, layout.TOKENIZER, layout.STATS]
    for row in table.itertuples():
        if row.documents:
            files += [layout.megatron_prefix(row.split, row.shard_id) + ext for ext in (".bin", ".idx")]
        if row.packed_rows > 0:
            files += [layout.packed_prefix(row.split, row.shard_id) + s for s in SUFFIXES.values()]
        files += [layout.llmc_file(row.split, row.shard_id, part) for part in range(row.llmc_files)]
    files += [layout.shuffle_file(split) for split, rows in table.groupby("split").packed_rows.sum().items() if rows]
    files += sorted({layout.rejects_file(r.shard_id) for r in table.itertuples() if r.rejected})
    return sorted(files)


def packing_summary(r: pd.Series, seq_len: int) -> dict:
    """Packing stats of summed stats rows, beside what one document per padded row would have cost."""
    slots = r.packed_real_tokens + r.packed_pad_tokens
    padded_slots = r.padded_layout_rows * seq_len
    return {
        "sequences": int(r.packed_rows),
        "real_tokens": int(r.packed_real_tokens),
        "pad_tokens": int(r.packed_pad_tokens),
        "utilization": round(float(r.packed_real_tokens / slots), 6) if slots else None,
        "padded_layout": {
            "sequences": int(r.padded_layout_rows),
            "utilization": round(float(r.tokens / padded_slots), 6) if padded_slots else None,
        },
    }


def split_summary(table: pd.DataFrame, seq_len: int) -> dict:
    by_split = table.groupby("split").sum(numeric_only=True)
    return {
        split: {"documents": int(r.documents), "tokens": int(r.tokens), "packing": packing_summary(r, seq_len)}
        for split, r in by_split.iterrows()
    }


def encoder_entry(store: Store) -> dict:
    """The run's encoder backend and version, as the tokenize stage chose it (absent for older outputs)."""
    if not store.exists(ENCODER_CHOICE):
        return {}
    choice = store.read_json(ENCODER_CHOICE)
    entry = {"name": choice["backend"], **{k: choice[k] for k in ("version", "reason", "unsafe")}}
    if store.exists(REFERENCE_CHECK):  # validate's re-encoded sample: documents, mismatches, allowed rate
        entry["reference_check"] = store.read_json(REFERENCE_CHECK)
    return {"encoder": entry}


def publish(config: TokenmillConfig, tokenizer: TokenizerInfo, table: pd.DataFrame) -> dict:
    """Write `manifest.json` for the validated dataset and return it."""
    store = config.output.store()
    shard_rows = table.drop_duplicates("shard_id")
    files = sorted(dataset_files(table) + [r for r in layout.FERTILITY_REPORT if store.exists(r)])
    with ThreadPoolExecutor(HASH_THREADS) as pool:  # hashlib and file or object reads release the GIL
        hashes = list(pool.map(store.sha256, files))
    manifest = {
        "name": config.name,
        "version": config.version(),
        "tokenmill_version": __version__,
        "dataset_hash": config.dataset_hash(),
        "config": config.dataset_config(),
        "tokenizer": {
            "path": layout.TOKENIZER,
            "sha256": tokenizer.sha256,
            "vocab_size": tokenizer.vocab_size,
            "eod_id": tokenizer.eod_id,
            "bos_id": tokenizer.bos_id,
            "pad_id": tokenizer.pad_id,
            "trained": tokenizer.trained,
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
        "files": [
            {"path": rel, **layout.describe(rel), "bytes": store.size(rel), "sha256": digest}
            for rel, digest in zip(files, hashes, strict=True)
        ],
    }
    store.write_json(layout.MANIFEST, manifest)
    return manifest


def publish_version(config: TokenmillConfig, manifest: dict, extra_files: list[str] = ()) -> dict:
    """Copy the dataset to `<publish path>/<name>/<version>/`, then its manifest, then point LATEST at it.

    A file already there with the manifest's size and sha256 is not copied again, so publishing twice
    copies nothing and a publish interrupted halfway (no manifest yet) is completed by the next one.
    Locally files are hard-linked where possible; between two object stores they are copied server-side.
    """
    source, root = config.output.store(), config.publish_root()
    target = Store(f"{root.url}/{manifest['version']}", root.storage_options)

    def publish_file(entry: dict) -> bool:
        if _already_there(source, target, entry):
            return False
        _copy(source, target, entry["path"])
        return True

    with ThreadPoolExecutor(HASH_THREADS) as pool:  # on object stores each file is a few round trips
        copied = sum(pool.map(publish_file, manifest["files"]))
    skipped = len(manifest["files"]) - copied
    for rel in extra_files:  # the report: small, about the run, not part of the data
        _copy(source, target, rel)
    target.write_json(layout.MANIFEST, manifest)
    root.write_bytes(layout.LATEST, f"{manifest['version']}\n".encode())
    return {"url": target.url, "copied": copied, "skipped": skipped}


def _already_there(source: Store, target: Store, entry: dict) -> bool:
    rel = entry["path"]
    if not target.exists(rel) or target.size(rel) != entry["bytes"]:
        return False
    if source.is_local and target.is_local and os.path.samefile(source.path(rel), target.path(rel)):
        return True
    return target.sha256(rel) == entry["sha256"]


def _copy(source: Store, target: Store, rel: str) -> None:
    if source.is_local and target.is_local:
        with target.writing(rel) as tmp:
            try:
                os.link(source.path(rel), tmp)  # free, and safe: every writer replaces files, never edits them
            except OSError:
                shutil.copyfile(source.path(rel), tmp)
    elif type(source.fs) is type(target.fs) and source.storage_options == target.storage_options:
        target.fs.copy(source.path(rel), target.path(rel))  # server-side, nothing through this process
    else:
        with source.local_copies(rel) as (path,):
            target.put(path, rel)
