"""Megatron-Bridge's packed conversations (`megatron_bridge`): Parquet, a row per packed row, as its
`GPTSFTPackedParquetDataset` reads them (`src/megatron/bridge/data/packing/parquet.py`): the row's conversations
back to back, unpadded (`input_ids`); `seq_start_id`, where each begins; `loss_mask` already shifted to the labels
(position t says whether the prediction of token t + 1 counts), as Bridge's own packer writes it. Written as the
conversations are packed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill.formats.arrow import list_array, packed_tokens_problem
from tokenmill.formats.table import SplitFound, SplitOut


def write(out: SplitOut) -> None:
    rows = out.packed
    with out.store.writing(out.rels[0], out.files) as tmp:
        write_rows(tmp, rows.rows, rows.cu_seqlens, rows.row_offsets, out.loss)


def check(found: SplitFound) -> list[str]:
    """A row per packed row, with the packed tokens."""
    return packed_tokens_problem(found, "input_ids", rows_counted=True)


def write_rows(path: str | Path, rows: np.ndarray, cu_seqlens, row_offsets, loss: np.ndarray) -> None:
    """Packed rows of conversations (`formats.packed`'s arrays and the packed loss mask) as Megatron-Bridge's packed
    Parquet rows. A conversation's first token never carries loss once packed, so shifting the whole row's mask
    left by one never carries a mask across a boundary."""
    cu_seqlens, row_offsets = np.asarray(cu_seqlens, np.int64), np.asarray(row_offsets, np.int64)
    real = cu_seqlens[row_offsets[1:] - 1]
    kept = np.arange(rows.shape[1]) < real[:, None]
    shifted = np.zeros_like(loss, dtype=np.int8)
    shifted[:, :-1] = loss[:, 1:]
    starts = np.ones(len(cu_seqlens), dtype=bool)
    starts[row_offsets[1:] - 1] = False  # each row's last boundary is its length, not a start
    table = pa.table(
        {
            "input_ids": list_array(np.asarray(rows)[kept].astype(np.int32), real, pa.int32()),
            "loss_mask": list_array(shifted[kept], real, pa.int8()),
            "seq_start_id": list_array(cu_seqlens[starts].astype(np.int32), np.diff(row_offsets) - 1, pa.int32()),
        }
    )
    pq.write_table(table, path, compression="zstd")
