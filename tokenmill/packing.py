"""Packing tokenized documents into fixed-length rows, with the document boundaries of every row.

`concat` (as Megatron's GPTDataset and nanoGPT do): documents, each ending in EOD, are joined into
one stream and cut into `seq_len` rows; only the last row of a shard and split is padded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Packed:
    rows: np.ndarray  # [n_rows, seq_len] tokens
    cu_seqlens: np.ndarray  # int32, flat: per row [0, end of 1st piece, ..., real tokens of the row]
    row_offsets: np.ndarray  # int64 [n_rows + 1]: row i's cu_seqlens are cu_seqlens[off[i]:off[i+1]]
    real_tokens: int

    @property
    def pad_tokens(self) -> int:
        return self.rows.size - self.real_tokens


def pack_concat(tokens: np.ndarray, lengths: np.ndarray, seq_len: int, pad_id: int) -> Packed:
    total = len(tokens)
    n_rows = -(-total // seq_len)
    rows = np.full(n_rows * seq_len, pad_id, dtype=tokens.dtype)
    rows[:total] = tokens
    # Every cut (a document end or a row end) closes a piece; a cut at p belongs to row (p - 1) // seq_len.
    doc_ends = np.cumsum(lengths, dtype=np.int64)
    row_ends = np.arange(seq_len, total, seq_len, dtype=np.int64)
    cuts = np.union1d(np.union1d(doc_ends, row_ends), [total]) if total else np.zeros(0, np.int64)
    cuts = cuts[cuts > 0]
    row_of_cut = (cuts - 1) // seq_len
    local = (cuts - row_of_cut * seq_len).astype(np.int32)
    cuts_per_row = np.bincount(row_of_cut, minlength=n_rows)
    row_offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(cuts_per_row + 1, out=row_offsets[1:])
    cu_seqlens = np.zeros(row_offsets[-1], dtype=np.int32)  # the zeros at each row start stay
    is_cut = np.ones(row_offsets[-1], dtype=bool)
    is_cut[row_offsets[:-1]] = False
    cu_seqlens[is_cut] = local
    return Packed(rows.reshape(n_rows, seq_len), cu_seqlens, row_offsets, total)
