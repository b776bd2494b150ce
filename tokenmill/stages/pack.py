"""The pack stage for one shard, and the split indexes after all of them.

pack[shard]: each split's Megatron documents packed as `pack.mode` says into
`packed/<split>/shard-NNNNN.{tokens,cu_seqlens,row_offsets}.npy` (see `formats/packed.py`), and, when
`output.formats` has `llmc`, the same token stream as llm.c files `llmc/<split>/shard-NNNNN-PPPP.bin`
(see `formats/llmc.py`), and the trainers' layouts it asks for (`formats.table`: each written by its module).
Stats per split: rows, real and pad tokens, the rows a padded one-document-per-row layout would take, llm.c files,
trainers' files.

split indexes: once every shard is packed, each split's global shuffle index `packed/<split>/shuffle.npy`, and
the `index.json` of the indexed trainers' layouts (litdata's, MDS's).
"""

from __future__ import annotations

import functools
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from tokenmill.config import PackConfig, TokenmillConfig
from tokenmill.core import layout
from tokenmill.core.commits import PACK, TOKENIZE, check, commit, pack_key, read_marker, shard_key, tokenize_key
from tokenmill.core.packers import (
    fit_conversations,
    global_shuffle_index,
    pack,
    pack_conversations,
    pack_pairs,
    pad_id,
    padded_layout_rows,
    writes_packed,
)
from tokenmill.core.stats import NOTHING_PACKED, Packed, Tokenized
from tokenmill.formats.datatrove import tokenizer_name
from tokenmill.formats.llmc import llmc_dtype, shard_bounds, write_llmc
from tokenmill.formats.megatron import MegatronReader, token_dtype
from tokenmill.formats.packed import LOSS_SUFFIX, SUFFIXES, write_packed, write_shuffle_index
from tokenmill.formats.provenance import read_documents_table
from tokenmill.formats.table import FORMATS, SplitOut
from tokenmill.io.storage import Store
from tokenmill.tokenizers.preference import fit_stored
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo


@dataclass(frozen=True)
class Packing:
    """What the pack stage uses of a run, made once (`of`) and sent with its shards' Dask tasks."""

    store: Store  # the build
    tokenize_key: str  # the run's parts of each shard's stage key (`commits.tokenize_key`, `commits.pack_key`)
    key: str
    pack: PackConfig | None  # how to pack rows; None: no packed rows are written
    pad_id: int
    llmc_shard_tokens: int | None  # the tokens of an llm.c file; None: no llm.c files are written
    vocab_size: int
    trainers: tuple[str, ...] = ()  # the trainers' layouts asked for (`OutputConfig.trainers`)
    seq_len: int = 0  # the tokens of an MDS row (pack.seq_len)
    tokenizer_name: str = ""  # the tokenizer as nanotron loads it (`.ds.metadata`)
    pairs: tuple[tuple[str, int, str], ...] = ()  # each stream of preference pairs, its max_length and too_long

    @classmethod
    def of(cls, config: TokenmillConfig, tokenizer: TokenizerInfo) -> Packing:
        return cls(
            config.output.store(),
            tokenize_key(config, tokenizer),
            pack_key(config),
            config.pack if writes_packed(config) else None,
            pad_id(config, tokenizer),
            config.output.llmc_shard_tokens if "llmc" in config.output.formats else None,
            tokenizer.vocab_size,
            config.output.trainers(),
            config.pack.seq_len,
            tokenizer_name(config.tokenizer.path),
            tuple((stream, *fit) for stream, fit in config.pair_streams().items()),
        )


def pack_shard(run: Packing, tokenized: Tokenized) -> Packed:
    """Pack one tokenized shard."""
    store, shard_id = run.store, tokenized.shard_id
    key = shard_key(run.tokenize_key, tokenized.source, run.key)
    earlier = check(store, PACK, shard_id, key)
    if earlier.result is not None:
        return Packed.from_json(earlier.result, reused=True)
    started = time.perf_counter()
    files: dict[str, dict] = {}  # size and sha256 of each file written, for the marker
    splits = {}
    for split, counts in tokenized.splits.items():
        stats = dict(NOTHING_PACKED)
        splits[split] = stats
        if counts["documents"] == 0 or (run.pack is None and run.llmc_shard_tokens is None and not run.trainers):
            continue
        source = layout.megatron_prefix(split, shard_id)
        with store.local_copies(source + ".bin", source + ".idx") as (bin_path, idx_path):
            reader = MegatronReader(source, bin_path=bin_path, idx_path=idx_path)
            tokens, lengths = reader.tokens, reader.index.lengths
            if split in {stream for stream, *_ in run.pairs}:
                stats |= pack_pairs_of(store, split, shard_id, tokens, lengths, run, files)
            elif run.pack is not None and "supervised" in counts:
                stats |= pack_conversations_of(store, split, shard_id, tokens, lengths, run, files)
            elif run.pack is not None:
                packed = pack(tokens, lengths, run.pack, run.pad_id)
                write_packed_files(store, split, shard_id, packed, files)
                stats |= {"rows": len(packed.rows), "real_tokens": packed.real_tokens, "pad_tokens": packed.pad_tokens}
                stats["padded_layout_rows"] = padded_layout_rows(lengths, run.pack.seq_len)
                del packed
            stats["trainer_files"] += write_trainer_files(store, split, shard_id, tokens, lengths, run, files)
            if run.llmc_shard_tokens is not None:
                parts = shard_bounds(len(tokens), run.llmc_shard_tokens)
                for part, (start, end) in enumerate(parts):
                    with store.writing(layout.llmc_file(split, shard_id, part), files) as tmp:
                        write_llmc(tmp, tokens[start:end], llmc_dtype(run.vocab_size))
                stats["llmc_files"] = len(parts)
            del reader, tokens, lengths
    result = Packed(shard_id, splits, round(time.perf_counter() - started, 3), redone=earlier.redone)
    commit(store, PACK, shard_id, key, result.to_json(), files)
    return result


def write_packed_files(store: Store, split: str, shard_id: int, packed, files: dict, loss=None) -> None:
    """A split's packed rows as `formats/packed.py` lays them out, and their loss mask where they are conversations."""
    target = layout.packed_prefix(split, shard_id)
    with ExitStack() as stack:
        writing = {key: store.writing_file(target + s, files, read_again=False) for key, s in SUFFIXES.items()}
        write_packed({key: stack.enter_context(w) for key, w in writing.items()}, packed)
    if loss is not None:
        with store.writing(target + LOSS_SUFFIX, files) as tmp, open(tmp, "wb") as f:
            np.save(f, loss, allow_pickle=False)


def pack_conversations_of(
    store: Store, split: str, shard_id: int, tokens: np.ndarray, lengths: np.ndarray, run: Packing, files: dict
) -> dict:
    """A conversations' split packed whole, with its loss mask (`packers.pack_conversations`), after the ones longer
    than a row are dropped, truncated or split as `pack.too_long` says; its stats, with those counted."""
    with store.local_copies(layout.loss_mask_file(split, shard_id)) as (mask_path,):
        masks = np.fromfile(mask_path, dtype=np.uint8)
    seq_len = run.pack.seq_len
    fitted = fit_conversations(np.asarray(tokens), masks, lengths, seq_len, run.pack.too_long)
    packed = pack_conversations(fitted.tokens, fitted.masks, fitted.lengths, seq_len, run.pad_id)
    write_packed_files(store, split, shard_id, packed.packed, files, packed.loss)
    rows = packed.packed
    written = write_layouts(run, "packing", store, split, shard_id, files, tokens=fitted.tokens, lengths=fitted.lengths,
                            masks=fitted.masks, packed=rows, loss=packed.loss)  # fmt: skip
    return {
        "trainer_files": written,
        "rows": len(rows.rows),
        "real_tokens": rows.real_tokens,
        "pad_tokens": rows.pad_tokens,
        "padded_layout_rows": padded_layout_rows(fitted.lengths, seq_len),
        "too_long": fitted.longer,
        "tokens_cut": fitted.tokens_lost,
    }


def pack_pairs_of(
    store: Store, split: str, shard_id: int, tokens: np.ndarray, lengths: np.ndarray, run: Packing, files: dict
) -> dict:
    """A split of preference pairs (each a chosen then a rejected sequence of the `.bin`, `lengths`) fitted to its
    max_length as its too_long says (`preference.fit_stored`: TRL's max_length, never one side only), packed whole
    (`packers.pack_pairs`) with their loss mask, and in TRL's DPO columns; its stats, the pairs dropped or cut
    counted as `too_long`, the tokens they lost as `tokens_cut`."""
    with store.local_copies(layout.loss_mask_file(split, shard_id)) as (mask_path,):
        masks = np.fromfile(mask_path, dtype=np.uint8)
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    # A pair's prompt ends where its chosen sequence's loss starts (its completion has a token at least)
    ones = np.flatnonzero(masks)
    prompts = ones[np.searchsorted(ones, starts[0::2])] - starts[0::2]
    max_length, too_long = next((m, t) for stream, m, t in run.pairs if stream == split)
    keep, kept = fit_stored(lengths, prompts, max_length, too_long)
    taken = np.repeat(starts[np.repeat(keep, 2)] - (np.cumsum(kept) - kept), kept) + np.arange(kept.sum())
    tokens, masks = np.asarray(tokens)[taken], masks[taken]
    stats = {"too_long": int((~keep).sum() + (kept != lengths[np.repeat(keep, 2)]).reshape(-1, 2).any(1).sum())}
    stats["tokens_cut"] = int(lengths.sum() - kept.sum())
    if run.pack is not None:
        packed = pack_pairs(tokens, masks, kept, run.pack.seq_len, run.pad_id)
        write_packed_files(store, split, shard_id, packed.packed, files, packed.loss)
        rows = packed.packed
        stats |= {"rows": len(rows.rows), "real_tokens": rows.real_tokens, "pad_tokens": rows.pad_tokens}
        stats["padded_layout_rows"] = int(keep.sum())  # a pair a row
    stats["trainer_files"] = write_layouts(
        run, "packing", store, split, shard_id, files, tokens=tokens, lengths=kept, masks=masks, prompts=prompts[keep]
    )
    return stats


def write_trainer_files(
    store: Store, split: str, shard_id: int, tokens: np.ndarray, lengths: np.ndarray, run: Packing, files: dict
) -> int:
    """A split's documents in each trainer's layout asked for that takes them as the `.bin` holds them (`formats.table`:
    made from documents; the others are made as conversations are packed): its ids (`tokens`) and its documents'
    `lengths`. How many files it wrote."""
    bin_rel = layout.megatron_prefix(split, shard_id) + ".bin"

    @functools.cache
    def bin_digest() -> dict:  # the size and sha256 its tokenize recorded, for a layout whose token file it is
        return read_marker(store, TOKENIZE, shard_id)["files"][bin_rel]

    def documents(columns: list[str]):
        with store.local_copies(layout.documents_table(split, shard_id)) as (path,):
            return read_documents_table(path, columns)

    return write_layouts(run, "documents", store, split, shard_id, files, tokens=tokens, lengths=lengths,
                         bin_rel=bin_rel, bin_digest=bin_digest, documents=documents)  # fmt: skip


def write_layouts(run: Packing, made_from: str, store: Store, split: str, shard_id: int, files: dict, **data) -> int:
    """Each trainer's layout asked for that is made from `made_from` (`formats.table`), of a shard's split, written by
    its module from `data` (`SplitOut`'s fields); how many files they are."""
    written = 0
    for format in (FORMATS[name] for name in run.trainers if FORMATS[name].made_from == made_from):
        rels = layout.trainer_files(format.name, split, shard_id)
        common = {"vocab_size": run.vocab_size, "seq_len": run.seq_len, "tokenizer_name": run.tokenizer_name}
        format.module().write(SplitOut(store, rels, files, **common, **data))
        written += len(rels)
    return written


def write_split_indexes(config: TokenmillConfig, tokenizer: TokenizerInfo, table: pd.DataFrame) -> dict[str, int]:
    """Once every shard is packed, each split's indexes over all its shards (`table`: the stats table, a row per
    shard and split): the shuffle index of its packed rows, and the `index.json` of each trainer's layout that
    reads through one (litdata, MDS), made from the stats. Return the packed rows per split. Cheap and
    deterministic, so they are simply rewritten on every run."""
    rows = write_shuffle_indexes(config, table) if writes_packed(config) else {}
    dtype, seq_len = token_dtype(tokenizer.vocab_size), config.pack.seq_len
    store = config.output.store()
    for format in layout.INDEXED_TRAINERS:
        for split in config.streams():
            shards = table[(table.split == split) & (table.documents > 0)].sort_values("shard_id")
            if shards.empty or format not in config.output.formats:  # none, or one an earlier run wrote
                store.remove(layout.trainer_index(format, split))
                continue
            files = [Path(layout.trainer_file(format, split, i)).name for i in shards.shard_id.tolist()]
            listed = zip(files, shards.documents.tolist(), shards.tokens.tolist(), strict=True)
            index = [{"filename": f, "documents": d, "tokens": t} for f, d, t in listed]
            store.write_json(
                layout.trainer_index(format, split), FORMATS[format].module().split_index(index, dtype, seq_len)
            )
    return rows


def write_shuffle_indexes(config: TokenmillConfig, table: pd.DataFrame) -> dict[str, int]:
    """Write each split's shuffle index over all its packed rows (`write_split_indexes`); return the rows per split."""
    store = config.output.store()
    rows = {}
    for split in config.streams():
        packed = table[(table.split == split) & (table.packed_rows > 0)].sort_values("shard_id")
        rows_per_shard = list(zip(packed.shard_id.tolist(), packed.packed_rows.tolist(), strict=True))
        rows[split] = sum(n for _, n in rows_per_shard)
        if not rows[split]:
            store.remove(layout.shuffle_file(split))
            continue
        index = global_shuffle_index(rows_per_shard, config.pack.shuffle_seed)
        with store.writing(layout.shuffle_file(split)) as tmp:
            write_shuffle_index(tmp, index)
    return rows
