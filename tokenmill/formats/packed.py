"""Packed sequences on disk, both directions. Per shard and split, `<prefix>.tokens.npy` `[n_rows, row_len]`,
`<prefix>.cu_seqlens.npy` (flat int32) and `<prefix>.row_offsets.npy` (int64, n_rows + 1); per split, the
global shuffle index `shuffle.npy` (int32 `[n_rows, 2]`: shard id, row). All memory-mappable with
`np.load(mmap_mode="r")`."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np

from tokenmill.core import layout
from tokenmill.core.packers import Packed
from tokenmill.formats.megatron import MegatronIndex
from tokenmill.formats.table import SplitFound

SUFFIXES = {"rows": ".tokens.npy", "cu_seqlens": ".cu_seqlens.npy", "row_offsets": ".row_offsets.npy"}
LOSS_SUFFIX = ".loss.npy"  # conversations (input.chat): uint8 [n_rows, seq_len], 1 where the token carries loss
PAD_CHECK_BYTES = 8 << 20  # a packed shard's padded rows are checked this many bytes of mask at a time


def write_packed(files: dict[str, BinaryIO], packed: Packed) -> None:
    """Write each array of `packed` to its open file (keys as in SUFFIXES), the bytes `np.save` writes; concat's
    rows block by block."""
    for key, f in files.items():
        array = getattr(packed, key)
        header = {"descr": np.lib.format.dtype_to_descr(array.dtype), "fortran_order": False, "shape": array.shape}
        np.lib.format.write_array_header_1_0(f, header)
        for block in [np.ascontiguousarray(array)] if isinstance(array, np.ndarray) else array.blocks():
            f.write(block)


class PackedReader:
    """Rows of a packed shard with the document boundaries inside each row."""

    def __init__(self, prefix: str | Path, *, paths: list[Path] | None = None):
        """Open `prefix` + SUFFIXES, or the given paths (in SUFFIXES order) when they are elsewhere."""
        rows, cu_seqlens, row_offsets = paths or [Path(f"{prefix}{s}") for s in SUFFIXES.values()]
        self.rows = np.load(rows, mmap_mode="r")
        self.cu_seqlens = np.load(cu_seqlens, mmap_mode="r")
        self.row_offsets = np.load(row_offsets, mmap_mode="r")
        loss = Path(f"{prefix}{LOSS_SUFFIX}")  # conversations' rows only
        self.loss = np.load(loss, mmap_mode="r") if paths is None and loss.exists() else None

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens of row i, its cu_seqlens: piece boundaries, the last one the row's real length)."""
        return np.asarray(self.rows[i]), np.asarray(self.cu_seqlens[self.row_offsets[i] : self.row_offsets[i + 1]])


def write_shuffle_index(path: str | Path, index: np.ndarray) -> None:
    """Write a split's shuffle index: int32 `[n_rows, 2]`, row p = (shard id, row) to read p-th."""
    index = np.asarray(index)
    if index.ndim != 2 or index.shape[1] != 2:
        raise ValueError(f"a shuffle index is [n_rows, 2], got shape {index.shape}")
    with open(path, "wb") as f:
        np.save(f, index.astype(np.int32, copy=False), allow_pickle=False)


def read_shuffle_index(path: str | Path) -> np.ndarray:
    """The shuffle index, memory-mapped."""
    return np.load(path, mmap_mode="r")


def split_files(row, run) -> list[str]:
    """A shard's split's files (`formats.table`): its rows, their boundaries and where each row's start, and
    conversations' loss mask; none where it has no rows. Windows are checked against the documents' lengths, so
    the split's Megatron `.idx` comes last."""
    if row.packed_rows == 0:
        return []
    prefix = layout.packed_prefix(row.split, row.shard_id)
    rels = [prefix + suffix for suffix in SUFFIXES.values()]
    if row.supervised_tokens >= 0:
        return [*rels, prefix + LOSS_SUFFIX]
    return [*rels, layout.megatron_prefix(row.split, row.shard_id) + ".idx"] if run.pack.mode == "window" else rels


def check(found: SplitFound) -> list[str]:
    """The rows against the split's stats and the pack mode: their shape, boundaries that rise from 0 in each row,
    the real and pad tokens the stats count, only pad ids after the real tokens; concat's rows full but the last,
    bfd's no more than a row per document, a window per row as the documents' lengths imply; conversations' loss
    mask."""
    row, pack, prefix = found.row, found.run.pack, found.rels[0].removesuffix(SUFFIXES["rows"])
    conversations = row.supervised_tokens >= 0  # packed whole, best-fit, seq_len wide, with their loss mask
    width = pack.seq_len if conversations else pack.row_len
    packed = PackedReader(prefix, paths=found.paths[:3])
    rows, offsets = packed.rows, np.asarray(packed.row_offsets)
    cu = np.asarray(packed.cu_seqlens, dtype=np.int64)
    if rows.shape != (row.packed_rows, width):
        return [f"{prefix}.tokens.npy: shape {rows.shape}, expected ({row.packed_rows}, {width})"]
    if len(offsets) != len(rows) + 1 or offsets[0] != 0 or offsets[-1] != len(cu):
        return [f"{prefix}.row_offsets.npy: does not index {prefix}.cu_seqlens.npy"]
    # Within a row boundaries start at 0 and strictly increase up to at most the row's width.
    rising = np.diff(cu) > 0
    rising[offsets[1:-1] - 1] = True  # the step from one row's end to the next row's 0
    if np.any(cu[offsets[:-1]] != 0) or not rising.all() or cu.max(initial=0) > width:
        return [f"{prefix}.cu_seqlens.npy: boundaries do not rise from 0 to at most {width} in every row"]
    real = cu[offsets[1:] - 1]
    if int(real.sum()) != row.packed_real_tokens or rows.size - int(real.sum()) != row.packed_pad_tokens:
        return [f"{prefix}.cu_seqlens.npy: {real.sum()} real tokens, stats say {row.packed_real_tokens}"]
    if not only_pad_after(rows, real, found.run.pad_id):
        return [f"{prefix}.tokens.npy: tokens other than pad id {found.run.pad_id} after the real tokens"]
    if conversations:
        return _loss_problems(found.rels[3], found.paths[3], rows.shape, row, prefix)
    if pack.mode == "concat" and np.any(real[:-1] != width):
        return [f"{prefix}.cu_seqlens.npy: a concat row other than the last is not full"]
    if pack.mode == "bfd" and row.packed_rows > row.padded_layout_rows:
        return [f"{prefix}.tokens.npy: {row.packed_rows} rows, more than one document per row would take"]
    if pack.mode == "window":
        return _window_problems(prefix, pack, np.asarray(rows), offsets, real, MegatronIndex(found.paths[3]).lengths)
    return []


def _loss_problems(rel: str, path, shape: tuple, row, prefix: str) -> list[str]:
    loss = np.load(path, mmap_mode="r")
    if loss.shape != shape or loss.max(initial=0) > 1 or int(loss.sum()) > row.supervised_tokens:
        return [f"{rel}: not a 0 or 1 per packed token, at most the {row.supervised_tokens} supervised tokens"]
    if row.packed_rows > row.padded_layout_rows:
        return [f"{prefix}.tokens.npy: {row.packed_rows} rows, more than one conversation per row would take"]
    return []


def only_pad_after(rows: np.ndarray, real: np.ndarray, pad_id: int) -> bool:
    """Whether every token of every row after its `real` tokens is `pad_id`: the padded rows only, a block of them
    at a time (a mask over all of a shard's rows is as large as its tokens, fresh memory for every shard)."""
    width = rows.shape[1]
    padded = np.flatnonzero(real < width)
    step = max(1, PAD_CHECK_BYTES // width)
    for start in range(0, len(padded), step):
        chosen = padded[start : start + step]
        if not np.all(rows[chosen][np.arange(width) >= real[chosen, None]] == pad_id):
            return False
    return True


def _window_problems(prefix: str, pack, rows: np.ndarray, offsets: np.ndarray, real, lengths) -> list[str]:
    """One window per row, as many and as long as the documents' `lengths` and the overlap imply, BOS/EOS in
    place."""
    if np.any(np.diff(offsets) != 2):
        return [f"{prefix}.cu_seqlens.npy: a window row holds more than one piece"]
    lengths = lengths.astype(np.int64)
    content, step = pack.window_content, pack.window_content - pack.stride
    windows = np.where(lengths > 0, 1 + -(-np.maximum(lengths - content, 0) // step), 0)
    doc = np.repeat(np.arange(len(lengths)), windows)
    within = (np.arange(len(doc)) - (np.cumsum(windows) - windows)[doc]) * step
    extras = (pack.bos_id is not None) + (pack.eos_id is not None)
    expected = np.minimum(content, lengths[doc] - within) + extras
    if len(expected) != len(real) or np.any(expected != real):
        return [f"{prefix}.cu_seqlens.npy: window lengths disagree with the documents and stride {pack.stride}"]
    if pack.bos_id is not None and np.any(rows[:, 0] != pack.bos_id):
        return [f"{prefix}.tokens.npy: a window does not start with BOS id {pack.bos_id}"]
    if pack.eos_id is not None and np.any(rows[np.arange(len(rows)), real - 1] != pack.eos_id):
        return [f"{prefix}.tokens.npy: a window does not end with EOS id {pack.eos_id}"]
    return []
