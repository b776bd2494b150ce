"""Packed sequences on disk, both directions. Per shard and split, `<prefix>.tokens.npy` `[n_rows, row_len]`,
`<prefix>.cu_seqlens.npy` (flat int32) and `<prefix>.row_offsets.npy` (int64, n_rows + 1); per split, the
global shuffle index `shuffle.npy` (int32 `[n_rows, 2]`: shard id, row). All memory-mappable with
`np.load(mmap_mode="r")`."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np

from tokenmill.core.packers import Packed

SUFFIXES = {"rows": ".tokens.npy", "cu_seqlens": ".cu_seqlens.npy", "row_offsets": ".row_offsets.npy"}
LOSS_SUFFIX = ".loss.npy"  # conversations (input.chat): uint8 [n_rows, seq_len], 1 where the token carries loss


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
