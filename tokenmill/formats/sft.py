"""Conversations and their loss masks in the layouts SFT trainers load as they are (docs/chat.md), and OLMo-core's
token files. The mask is tokenmill's throughout: `mask[t]` is 1 where token t is a target that carries loss (the
model predicts it from the tokens before it); each layout says it the way its trainer reads it.

- TRL (`trl`): Parquet, a row per conversation: `input_ids`, `attention_mask`, and `labels`, the ids where they
  carry loss and -100 elsewhere, aligned with `input_ids` (the model shifts them), as TRL's SFTTrainer and its
  collator take them (`trl/trainer/sft_trainer.py`: a `labels` column is kept as it is).
- TRL, preference pairs (`trl` of an `input.preference`): Parquet, a row per pair, TRL 1.16's tokenized DPO columns
  `prompt_ids`, `chosen_ids`, `rejected_ids` (what `DPOTrainer._prepare_dataset` makes, and what its
  `DataCollatorForPreference` reads); a trainer computes the loss on the completions' ids.
- Megatron-Bridge (`megatron_bridge`): Parquet, a row per packed row, as its `GPTSFTPackedParquetDataset` reads
  them (`src/megatron/bridge/data/packing/parquet.py`): the row's conversations back to back, unpadded
  (`input_ids`); `seq_start_id`, where each begins; `loss_mask` already shifted to the labels (position t says
  whether the prediction of token t + 1 counts), as Bridge's own packer writes it.
- OLMo-core (`olmo`): the tokens as a raw array named `.npy` (no header: what `np.memmap` maps, the `.bin`'s bytes),
  and beside it a `.csv.gz` of each document's `start,end,id,src,loc` (dolma's columns: the input file and line,
  from the documents table), from which OLMo's numpy datasets take the documents (the first two); a conversations'
  label mask is the Megatron `.loss_mask.bin` (`label_mask_paths`).
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

IGNORE_INDEX = -100


def list_array(values: np.ndarray, lengths: np.ndarray, type: pa.DataType) -> pa.ListArray:
    """`values` cut into lists of `lengths` as one Arrow column, from the flat array (no Python object per list)."""
    if len(values) >= 2**31:
        raise ValueError(f"{len(values)} values do not fit one Arrow list column (int32 offsets): smaller shards")
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    of_type = pa.list_(pa.field("element", type, nullable=False))  # no value is null (Parquet: no level to say so)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=type), type=of_type)


def write_trl(path: str | Path, tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray) -> None:
    """Conversations (their tokens and masks back to back, and their lengths) as TRL's Parquet rows."""
    tokens = np.asarray(tokens, dtype=np.int32)
    labels = np.where(np.asarray(masks) == 1, tokens, IGNORE_INDEX).astype(np.int32)
    table = pa.table(
        {
            "input_ids": list_array(tokens, lengths, pa.int32()),
            "attention_mask": list_array(np.ones(len(tokens), np.int8), lengths, pa.int8()),
            "labels": list_array(labels, lengths, pa.int32()),
        }
    )
    pq.write_table(table, path, compression="zstd")


def write_trl_pairs(path: str | Path, tokens: np.ndarray, lengths: np.ndarray, prompts: np.ndarray) -> None:
    """Preference pairs (each one's chosen then rejected sequence back to back in `tokens`, their `lengths`, and each
    pair's prompt length `prompts`) as TRL's tokenized DPO rows: the prompt's ids once, then each completion's."""
    tokens, lengths = np.asarray(tokens, dtype=np.int32), np.asarray(lengths, dtype=np.int64)
    prompts = np.asarray(prompts, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    pieces = np.stack([prompts, lengths[0::2] - prompts, lengths[1::2] - prompts], axis=1).reshape(-1)
    # each pair's prompt (of its chosen sequence), chosen completion, rejected completion: where each lies
    where = np.stack([starts[0::2], starts[0::2] + prompts, starts[1::2] + prompts], axis=1).reshape(-1)
    taken = np.repeat(where - (np.cumsum(pieces) - pieces), pieces) + np.arange(pieces.sum())
    columns = list_array(tokens[taken], pieces, pa.int32())
    names = ("prompt_ids", "chosen_ids", "rejected_ids")
    table = pa.table({name: columns.take(pa.array(np.arange(k, len(pieces), 3))) for k, name in enumerate(names)})
    pq.write_table(table, path, compression="zstd")


def write_megatron_bridge(path: str | Path, rows: np.ndarray, cu_seqlens, row_offsets, loss: np.ndarray) -> None:
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


def olmo_documents(lengths: np.ndarray, documents: pa.Table) -> bytes:
    """OLMo-core's `.csv.gz` beside a token file, as dolma writes it: `start,end,id,src,loc` per document (end
    exclusive; OLMo reads the first two), the id, input file and line from the split's documents table
    (`formats.provenance`, a row per document in the same order). Written by Arrow, which quotes every string (a
    CSV reader reads them as Python's `csv` writes them, unquoted; a tenth of the time)."""
    ends = np.cumsum(lengths, dtype=np.int64)
    table = pa.table({"start": ends - lengths, "end": ends, "id": documents.column("id"),
                      "src": documents.column("file"), "loc": documents.column("line")})  # fmt: skip
    text = io.BytesIO()
    pa_csv.write_csv(table, text, pa_csv.WriteOptions(include_header=False, quoting_style="needed"))
    return gzip.compress(text.getvalue(), compresslevel=1, mtime=0)  # level 9: 9x the time, 11% smaller
