"""TRL's layouts (`trl`), as its trainers load them with no conversion (docs/chat.md). The mask is tokenmill's:
`mask[t]` is 1 where token t is a target that carries loss.

- Conversations: Parquet, a row per conversation: `input_ids`, `attention_mask`, and `labels`, the ids where they
  carry loss and -100 elsewhere, aligned with `input_ids` (the model shifts them), as TRL's SFTTrainer and its
  collator take them (`trl/trainer/sft_trainer.py`: a `labels` column is kept as it is).
- Preference pairs (of an `input.preference`): Parquet, a row per pair, TRL 1.16's tokenized DPO columns
  `prompt_ids`, `chosen_ids`, `rejected_ids` (what `DPOTrainer._prepare_dataset` makes, and what its
  `DataCollatorForPreference` reads); a trainer computes the loss on the completions' ids.

Written as conversations and pairs are packed, of those the packed rows hold (after `pack.too_long`, or the pairs'
max_length).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenmill.formats.arrow import list_array, packed_tokens_problem
from tokenmill.formats.table import SplitFound, SplitOut

IGNORE_INDEX = -100


def write(out: SplitOut) -> None:
    with out.store.writing(out.rels[0], out.files) as tmp:
        if out.prompts is not None:
            write_pairs(tmp, out.tokens, out.lengths, out.prompts)
        else:
            write_conversations(tmp, out.tokens, out.masks, out.lengths)


def check(found: SplitFound) -> list[str]:
    """Its rows hold the conversations (pairs) that the packed rows hold: their tokens counted."""
    column = "prompt_ids" if "prompt_ids" in pq.read_schema(found.paths[0]).names else "labels"
    return packed_tokens_problem(found, column, rows_counted=False)


def write_conversations(path: str | Path, tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray) -> None:
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


def write_pairs(path: str | Path, tokens: np.ndarray, lengths: np.ndarray, prompts: np.ndarray) -> None:
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
