"""Reading a published dataset back: find its manifest (directly, or through a `LATEST` pointer), print
what it holds, verify that every file it lists is there with its size and sha256, and find a document's origin and
tokens through the documents tables (`formats.provenance`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenmill.core import layout
from tokenmill.core.shares import target_text
from tokenmill.io.storage import Planted, Store, inside


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
        version = store.stored_name(store.read_bytes(layout.LATEST).decode().strip(), layout.LATEST)
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
    listed = {entry["path"] for entry in m["files"] if entry["path"].startswith(f"{layout.MIX}/")}
    if mix := m.get("mix"):
        lines.append(
            f"  the mix: {mix['total_tokens']:,} {mix['split']} tokens drawn from {len(mix['sources'])} sources"
        )
        for name, source in mix["sources"].items():
            lines.append(
                f"    {name}: {target_text(source['target'])} -> {source['share']:.2%} of the mix, "
                f"{source['epochs']:.2f} epochs of its {source['splits'][mix['split']]['tokens']:,} tokens"
            )
        for format in layout.MIX_TRAINERS:  # the mix in each trainer's own terms (tokenmill.stages.mix)
            if layout.mix_trainer_file(format, mix["split"]) in listed:
                lines.append(f"  {format}: {dataset.store.url}/{layout.mix_trainer_file(format, mix['split'])}")
    mixed = layout.MIX_TRAIN_ARGS in listed
    if mixed or dataset.store.exists(layout.MEGATRON_TRAIN_ARGS):  # a single input's: beside its data (stages.mix)
        args, per_split = (
            (layout.MIX_TRAIN_ARGS, layout.MIX_PER_SPLIT_ARGS)
            if mixed
            else (layout.MEGATRON_TRAIN_ARGS, layout.MEGATRON_PER_SPLIT_ARGS)
        )
        lines.append(f"  Megatron: --data-args-path {dataset.store.url}/{args}")
        lines.append(f"            --per-split-data-args-path {dataset.store.url}/{per_split}")
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
    from tokenmill.stages.publish import input_changes

    a, b = old.manifest, new.manifest
    if "inputs" not in a or "inputs" not in b:
        raise NotADataset("a manifest lists no input files (an older tokenmill made it): nothing to compare")
    changes = input_changes(a["inputs"]["files"], b["inputs"]["files"])
    lines = [f"{a['name']} {a['version']} -> {b['name']} {b['version']}"]
    source_of = {f["path"]: f["mix_source"] for m in (a, b) for f in m["inputs"]["files"] if "mix_source" in f}
    for kind, paths in changes.items():
        lines.append(f"  {len(paths)} input files {kind}")
        lines += [
            f"    {'+~-'[list(changes).index(kind)]} {p}" + (f" ({source_of[p]})" if p in source_of else "")
            for p in paths
        ]
    for key in ("documents_in", "documents_out", "documents_rejected", "tokens"):
        before, after = a["counts"][key], b["counts"][key]
        lines.append(f"  {key}: {before:,} -> {after:,} ({after - before:+,})")
    if "mix" in a or "mix" in b:  # per source: its training tokens, its share of the mix and its epochs
        old_mix, new_mix = a.get("mix", {"sources": {}}), b.get("mix", {"sources": {}})
        for name in dict.fromkeys([*old_mix["sources"], *new_mix["sources"]]):
            was, now = old_mix["sources"].get(name), new_mix["sources"].get(name)
            if was is None or now is None:
                lines.append(f"  source {name}: {'added' if was is None else 'removed'}")
                continue
            before, after = (s["splits"][m["split"]]["tokens"] for s, m in ((was, old_mix), (now, new_mix)))
            lines.append(
                f"  source {name}: {before:,} -> {after:,} tokens ({after - before:+,}); share "
                f"{was['share']:.2%} -> {now['share']:.2%}; epochs {was['epochs']:.2f} -> {now['epochs']:.2f}"
            )
    return lines


def verify(dataset: Dataset) -> list[str]:
    """One message per listed file that is missing or differs in size or sha256 (empty: all intact), or is no file
    of the dataset: a path leading out of it, or (locally) a link or special file in a file's place."""
    problems = []
    for entry in dataset.manifest["files"]:
        rel = entry["path"]
        if inside(rel) != rel:
            problems.append(f"{rel}: not a path inside the dataset (named by its manifest)")
            continue
        try:
            now = dataset.store.digest(rel)
        except FileNotFoundError:
            problems.append(f"{rel}: missing")
            continue
        except Planted:
            problems.append(f"{rel}: a link or special file, not the file published")
            continue
        if now["bytes"] != entry["bytes"]:
            problems.append(f"{rel}: {now['bytes']} bytes, the manifest says {entry['bytes']}")
        elif now["sha256"] != entry["sha256"]:
            problems.append(f"{rel}: sha256 differs from the manifest")
    return problems


@dataclass
class Document:
    """A document found by its id: its row of a documents table (`formats.provenance`), where that table is, and
    its tokens."""

    table: str  # the documents table's path in the dataset
    shard: int
    row: dict  # id, source, file, line, split, token_offset, token_length, then the metadata fields
    tokens: np.ndarray


def find_documents(dataset: Dataset, doc_id: str) -> list[Document]:
    """Every document with id `doc_id` (one, unless a mixture's sources share an id), in the manifest's order."""
    import pyarrow.compute as pc

    from tokenmill.formats.megatron import MegatronReader
    from tokenmill.formats.provenance import read_documents_table

    found = []
    for entry in dataset.manifest["files"]:
        if entry["kind"] != "documents-table":
            continue
        rel = entry["path"]
        with dataset.store.local_copies(rel) as (path,):
            matches = pc.indices_nonzero(pc.equal(read_documents_table(path, ["id"]).column("id"), doc_id))
            rows = read_documents_table(path).take(matches).to_pylist() if len(matches) else []  # the ids only, mostly
        for row in rows:
            prefix = rel.removesuffix(".docs.parquet")
            with dataset.store.local_copies(prefix + ".bin", prefix + ".idx") as (bin_path, idx_path):
                tokens = MegatronReader(prefix, bin_path=bin_path, idx_path=idx_path).tokens
                start = row["token_offset"]
                found.append(Document(rel, entry["shard"], row, np.array(tokens[start : start + row["token_length"]])))
    return found


def document_lines(dataset: Dataset, document: Document) -> list[str]:
    """A document's origin, where its tokens lie, its metadata fields and its text decoded with the dataset's
    tokenizer (special tokens shown)."""
    from tokenizers import Tokenizer

    from tokenmill.core.layout import DOCUMENTS_COLUMNS

    row = document.row
    tokenizer = Tokenizer.from_str(dataset.store.read_bytes(layout.TOKENIZER).decode())
    bin_file = document.table.removesuffix(".docs.parquet") + ".bin"
    where = "row" if row["file"].endswith((".parquet", ".pq")) else "line"
    lines = [
        f"document {row['id']}" + (f" of source {row['source']}" if row["source"] else ""),
        f"  from {row['file']}, {where} {row['line']}",
        f"  split {row['split']}, {layout.shard_name(document.shard)}: tokens {row['token_offset']:,} to "
        f"{row['token_offset'] + row['token_length']:,} of {bin_file} ({row['token_length']:,} tokens)",
    ]
    lines += [f"  {name}: {value}" for name, value in row.items() if name not in DOCUMENTS_COLUMNS]
    return [*lines, "  text:", tokenizer.decode(document.tokens.tolist(), skip_special_tokens=False)]
