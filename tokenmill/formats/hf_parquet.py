"""Documents' token ids as Parquet for HF `datasets` (`load_dataset("parquet", data_dir=...)`, map-style or
streaming), both directions: a row per document, its ids (EOD last where the run appends it) in `input_ids`, a
list of the Megatron `.bin`'s dtype (uint16, or int32 for vocabularies of 65,500 and more), which `datasets` keeps
(`LargeList(Value("uint16"))`).

Written by polars: Parquet stores a list's every value with its levels, which pyarrow's writer encodes at about a
third of polars' speed (220 against 75 ms a 16M-token shard, one core), the largest cost of the trainers' layouts.
Polars writes its lists as Arrow's large lists, so `datasets` reads a `LargeList`; its rows are the same. The column
is made from the flat ids and the lengths, not a Python list per document. Token ids hardly compress: the file is
written uncompressed, without statistics (nobody filters token ids by their min and max)."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenmill.formats.sft import list_array

COLUMN = "input_ids"
ROW_GROUP_DOCUMENTS = 65_536  # rows of a row group: what a streaming reader holds at once


def write_parquet(file: str | Path | BinaryIO, tokens: np.ndarray, lengths: np.ndarray) -> None:
    """Documents of `lengths` tokens back to back in `tokens` as a row each, into `file` (a path, or open)."""
    import polars as pl  # 0.3 s to import: only in a run that writes this layout

    tokens = np.asarray(tokens)
    column = pl.from_arrow(list_array(tokens, lengths, pa.from_numpy_dtype(tokens.dtype)))  # no copy
    pl.DataFrame({COLUMN: column}).write_parquet(
        file, compression="uncompressed", statistics=False, row_group_size=ROW_GROUP_DOCUMENTS
    )


def read_documents(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A file's ids back to back and its documents' lengths."""
    column = pq.read_table(path, columns=[COLUMN])[COLUMN]
    return pc.list_flatten(column).to_numpy(), pc.list_value_length(column).to_numpy()
