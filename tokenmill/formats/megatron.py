"""Megatron-LM indexed datasets (`.bin` + `.idx`), both directions, as megatron-core writes and reads them.

`.idx` layout (little-endian): magic `MMIDIDX\\x00\\x00`, u64 version 1, u8 dtype code, u64 sequence
count, u64 document count, then int32 sequence lengths, int64 byte pointers into `.bin`, int64 document
indices (`[0, 1, ..., n]` when every document is one sequence). `.bin` is the tokens back to back.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from tokenmill.core import layout
from tokenmill.formats.provenance import read_documents_table, tiling_problem
from tokenmill.formats.table import SplitFound
from tokenmill.io.direct import range_reader

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def token_dtype(vocab_size: int) -> np.dtype:
    """megatron-core's choice: uint16 when the vocabulary fits (its threshold is 65500), else int32."""
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def fitting(ids: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`ids`, each of which `dtype` holds; an id it cannot hold is an error, never a wrapped id."""
    if len(ids) and int(ids.max()) > np.iinfo(dtype).max:
        raise ValueError(f"token id {int(ids.max())} does not fit the output's {dtype} (is the vocab size right?)")
    return ids


def narrowed(ids: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`ids` as `dtype` (`fitting`)."""
    return fitting(ids, dtype).astype(dtype, copy=False)


class BinWriter:
    """Appends documents' tokens to an open `.bin` file and remembers their lengths for the `.idx`."""

    def __init__(self, file: BinaryIO, dtype: np.dtype):
        self.file, self.dtype = file, np.dtype(dtype)
        self.lengths: list[np.ndarray] = []

    def add(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(flat, dtype=self.dtype))  # its buffer, not a copy of it
        self.lengths.append(np.asarray(lengths, dtype=np.int32))

    def add_part(self, flat: np.ndarray) -> None:
        """Tokens of a long document written in parts: its length comes with its last part (`add`)."""
        self.file.write(np.ascontiguousarray(flat, dtype=self.dtype))

    def all_lengths(self) -> np.ndarray:
        return np.concatenate(self.lengths) if self.lengths else np.zeros(0, dtype=np.int32)


def write_index(path: str | Path, lengths: np.ndarray, dtype: np.dtype, sequences_per_document: int = 1) -> None:
    """The `.idx` of sequences of `lengths`, each document `sequences_per_document` of them (a preference pair: its
    chosen and its rejected sequence)."""
    lengths = np.asarray(lengths, dtype=np.int32)
    n = len(lengths)
    documents = np.arange(0, n + 1, sequences_per_document, dtype=np.int64)
    pointers = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=pointers[1:])
    pointers *= np.dtype(dtype).itemsize
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", DTYPE_CODES[np.dtype(dtype)]))
        f.write(struct.pack("<Q", n))
        f.write(struct.pack("<Q", len(documents)))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(documents.tobytes())


def write_indexed_dataset(prefix: str | Path, documents: list[np.ndarray], dtype: np.dtype) -> None:
    """Write `prefix.bin` and `prefix.idx` holding one sequence per document."""
    with open(f"{prefix}.bin", "wb") as f:
        writer = BinWriter(f, dtype)
        for doc in documents:
            writer.add(np.asarray(doc), np.array([len(doc)]))
    write_index(f"{prefix}.idx", writer.all_lengths(), dtype)


class CorruptIndex(ValueError):
    """A `.idx` file that is not a valid Megatron index (message names the file)."""


class MegatronIndex:
    """The parsed `.idx`: dtype, sequence lengths, pointers and document indices (memory-mapped)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        buf = np.memmap(path, dtype=np.uint8, mode="r")
        header = bytes(buf[:34])
        if len(header) < 34 or header[:9] != MAGIC:
            raise CorruptIndex(f"{path}: not a Megatron index (bad magic)")
        version, code, n, n_docs = struct.unpack("<QBQQ", header[9:34])
        if version != VERSION or code not in CODE_DTYPES:
            raise CorruptIndex(f"{path}: unsupported version {version} or dtype code {code}")
        expected = 34 + n * 4 + n * 8 + n_docs * 8
        if len(buf) < expected:
            raise CorruptIndex(f"{path}: {len(buf)} bytes, the header promises {expected}")
        self.dtype = CODE_DTYPES[code]
        self.lengths = np.frombuffer(buf, np.int32, n, 34)
        self.pointers = np.frombuffer(buf, np.int64, n, 34 + n * 4)
        self.document_indices = np.frombuffer(buf, np.int64, n_docs, 34 + n * 12)
        self.nbytes = len(buf)

    def __len__(self) -> int:
        return len(self.lengths)


class MegatronReader:
    """Random access to the documents of `prefix.bin/.idx`, memory-mapped."""

    def __init__(self, prefix: str | Path, *, bin_path: str | Path | None = None, idx_path: str | Path | None = None):
        self.index = MegatronIndex(idx_path or f"{prefix}.idx")
        bin_path = Path(bin_path or f"{prefix}.bin")
        self.tokens = (
            np.memmap(bin_path, dtype=self.index.dtype, mode="r")
            if bin_path.stat().st_size
            else np.zeros(0, self.index.dtype)
        )

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> np.ndarray:
        start = self.index.pointers[i] // self.index.dtype.itemsize
        return np.asarray(self.tokens[start : start + self.index.lengths[i]])


CHECK_WINDOW_BYTES = 8 << 20


def split_files(row, run) -> list[str]:
    """A shard's split's files (`formats.table`): its `.bin` and `.idx`, its documents table, and conversations'
    loss mask; none where the split has no documents."""
    if row.documents == 0:
        return []
    prefix = layout.megatron_prefix(row.split, row.shard_id)
    rels = [prefix + ".bin", prefix + ".idx", layout.documents_table(row.split, row.shard_id)]
    return rels + [layout.loss_mask_file(row.split, row.shard_id)] if row.supervised_tokens >= 0 else rels


def check(found: SplitFound) -> list[str]:
    """The `.idx` against the `.bin` and the split's stats (preference pairs: each document two sequences, chosen
    and rejected), the documents table tiling the `.bin`, and each document's BOS and EOD, or conversations' loss
    mask (their template placed their specials)."""
    row, run, dtype, (bin_rel, idx_rel, *_) = found.row, found.run, found.dtype, found.rels
    bin_path, idx_path, table_path, *mask_path = found.paths
    pairs = row.split in run.pairs
    each = 2 if pairs else 1
    try:
        reader = MegatronReader(bin_rel, bin_path=bin_path, idx_path=idx_path)
    except CorruptIndex as e:
        return [str(e).replace(str(idx_path), idx_rel)]
    index = reader.index
    if index.dtype != dtype:
        return [f"{idx_rel}: dtype {index.dtype}, expected {dtype}"]
    if len(index) != each * row.documents:
        return [f"{idx_rel}: {len(index)} sequences, stats say {row.documents} documents of {each}"]
    if int(index.lengths.sum(dtype=np.int64)) != row.tokens or len(reader.tokens) != row.tokens:
        return [f"{bin_rel}: {len(reader.tokens)} tokens, index says {index.lengths.sum()}, stats {row.tokens}"]
    if not np.array_equal(index.document_indices, np.arange(0, len(index) + 1, each)):
        return [f"{idx_rel}: document indices are not 0..{len(index)}" + (" by 2 (pairs)" if pairs else "")]
    if not np.array_equal(index.pointers[1:], np.cumsum(index.lengths[:-1], dtype=np.int64) * dtype.itemsize):
        return [f"{idx_rel}: pointers disagree with lengths"]
    lengths = index.lengths.astype(np.int64)
    table_rel = found.rels[2]
    try:
        table = read_documents_table(table_path, ["split", "token_offset", "token_length"])
    except (pa.ArrowException, OSError) as e:
        return [f"{table_rel}: not a documents table ({e})"]
    if problem := tiling_problem(table, lengths[0::2] + lengths[1::2] if pairs else lengths, row.split, table_rel):
        return [problem]
    if mask_path:
        return _loss_mask_problems(found.rels[3], mask_path[0], row)
    starts = index.pointers // dtype.itemsize
    ends = starts + index.lengths - 1
    if run.eod_id is not None and (bad := int((tokens_at(bin_path, ends, dtype) != run.eod_id).sum())):
        return [f"{bin_rel}: {bad} documents do not end with EOD id {run.eod_id}"]
    if run.bos_id is not None and (bad := int((tokens_at(bin_path, starts, dtype) != run.bos_id).sum())):
        return [f"{bin_rel}: {bad} documents do not start with BOS id {run.bos_id}"]
    return []


def _loss_mask_problems(rel: str, path, row) -> list[str]:
    """A conversations' split's loss mask: a byte, 0 or 1, per token of its `.bin`, as many 1s as stats say."""
    mask = np.fromfile(path, dtype=np.uint8)
    if len(mask) != row.tokens:
        return [f"{rel}: {len(mask)} bytes, not one per token ({row.tokens})"]
    if mask.max(initial=0) > 1 or int(mask.sum()) != row.supervised_tokens:
        return [f"{rel}: not 0 or 1 per token with {row.supervised_tokens} ones, as stats say"]
    return []


def tokens_at(path, positions: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The tokens of the `.bin` at `path` at the ascending `positions`, a window of CHECK_WINDOW_BYTES at a time
    (`direct.range_reader`: from the page cache, or around it for a `.bin` written so): a map of the whole file
    touched at every document's end had the kernel map most of its pages around those (fault-around), a shard's
    `.bin` counted whole in the worker's resident memory (0.5 GB for a 600 MB shard)."""
    per_window = CHECK_WINDOW_BYTES // dtype.itemsize
    size = os.path.getsize(path) // dtype.itemsize
    found = np.empty(len(positions), dtype)
    bounds = np.searchsorted(positions, np.arange(0, size + per_window, per_window))
    with open(path, "rb") as f, range_reader(f, CHECK_WINDOW_BYTES) as read:
        for window, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            if hi > lo:
                start, stop = window * per_window, min(size, (window + 1) * per_window)
                tokens = np.frombuffer(read(start * dtype.itemsize, stop * dtype.itemsize), dtype)
                found[lo:hi] = tokens[positions[lo:hi] - start]
    return found
