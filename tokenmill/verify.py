"""Reading a published dataset back: find its manifest (directly, or through a `LATEST` pointer), print
what it holds, and verify that every file it lists is there with its size and sha256."""

from __future__ import annotations

from dataclasses import dataclass

from tokenmill import layout
from tokenmill.storage import Store


class NotADataset(Exception):
    """The path holds no manifest: not a dataset, or a publish that never completed."""


@dataclass
class Dataset:
    store: Store
    manifest: dict


def open_dataset(path: str, storage_options: dict | None = None) -> Dataset:
    """The dataset at `path`: a directory holding `manifest.json`, or one holding `LATEST`."""
    store = Store(path, storage_options)
    if not store.exists(layout.MANIFEST) and store.exists(layout.LATEST):
        version = store.read_bytes(layout.LATEST).decode().strip()
        store = Store(f"{store.url}/{version}", storage_options)
    if not store.exists(layout.MANIFEST):
        raise NotADataset(f"{path}: no {layout.MANIFEST} (not a dataset, or its publish did not complete)")
    return Dataset(store, store.read_json(layout.MANIFEST))


def summary_lines(dataset: Dataset) -> list[str]:
    m = dataset.manifest
    counts, tok = m["counts"], m["tokenizer"]
    lines = [
        f"{m['name']} {m.get('version', '')} at {dataset.store.url}",
        f"  tokenmill {m['tokenmill_version']}, dataset hash {m['dataset_hash']}",
        f"  tokenizer sha256 {tok['sha256'][:16]}..., vocab {tok['vocab_size']:,}, EOD id {tok['eod_id']}, "
        f"{m['dtype']} tokens",
        f"  {m['shards']} shards: {counts['documents_in']:,} documents in, {counts['documents_out']:,} tokenized, "
        f"{counts['documents_rejected']:,} rejected, {counts['tokens']:,} tokens",
    ]
    for split, s in m["splits"].items():
        lines.append(f"  {split}: {s['documents']:,} documents, {s['tokens']:,} tokens")
    files = m["files"]
    lines.append(f"  {len(files)} files, {sum(f['bytes'] for f in files) / 1e6:,.1f} MB")
    if inputs := m.get("inputs"):
        lines.append(f"  input: {len(inputs['files'])} files, inputs hash {inputs['hash']}")
    if (line := m.get("lineage")) and line["previous_version"]:
        lines.append(
            f"  built from version {line['previous_version']}: {line['inputs_added']} input files added, "
            f"{line['inputs_changed']} changed, {line['inputs_removed']} removed; {line['shards_kept']} shards kept, "
            f"{line['shards_made']} made"
        )
    elif line:
        lines.append(f"  the first version of its lineage: {line['shards_made']} shards made")
    return lines


def diff_lines(old: Dataset, new: Dataset) -> list[str]:
    """The input files added, changed and removed from `old` to `new`, and how the counts moved."""
    from tokenmill.publish import input_changes

    a, b = old.manifest, new.manifest
    if "inputs" not in a or "inputs" not in b:
        raise NotADataset("a manifest lists no input files (an older tokenmill made it): nothing to compare")
    changes = input_changes(a["inputs"]["files"], b["inputs"]["files"])
    lines = [f"{a['name']} {a['version']} -> {b['name']} {b['version']}"]
    for kind, paths in changes.items():
        lines.append(f"  {len(paths)} input files {kind}")
        lines += [f"    {'+~-'[list(changes).index(kind)]} {p}" for p in paths]
    for key in ("documents_in", "documents_out", "documents_rejected", "tokens"):
        before, after = a["counts"][key], b["counts"][key]
        lines.append(f"  {key}: {before:,} -> {after:,} ({after - before:+,})")
    return lines


def verify(dataset: Dataset) -> list[str]:
    """One message per listed file that is missing or differs in size or sha256 (empty: all intact)."""
    problems = []
    for entry in dataset.manifest["files"]:
        rel = entry["path"]
        if not dataset.store.exists(rel):
            problems.append(f"{rel}: missing")
        elif (size := dataset.store.size(rel)) != entry["bytes"]:
            problems.append(f"{rel}: {size} bytes, the manifest says {entry['bytes']}")
        elif dataset.store.sha256(rel) != entry["sha256"]:
            problems.append(f"{rel}: sha256 differs from the manifest")
    return problems
