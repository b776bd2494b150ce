"""Documents' token ids as Parquet for HF `datasets` (`load_dataset("parquet", data_dir=...)`, map-style or
streaming), both directions: a row per document, its ids (EOD last where the run appends it) in `input_ids`, a
list of the Megatron `.bin`'s dtype (uint16, or int32 for vocabularies of 65,500 and more), which `datasets` keeps
(`List(Value("uint16"))`). The column is made from the flat ids and the lengths, not a Python list per document.
Token ids hardly compress: the file is written uncompressed, without a dictionary, at the cost of a copy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenmill.formats.sft import list_array

COLUMN = "input_ids"
ROW_GROUP_DOCUMENTS = 65_536  # rows of a row group: what a streaming reader holds at once


def write_parquet(path: str | Path, tokens: np.ndarray, lengths: np.ndarray) -> None:
    """Documents of `lengths` tokens back to back in `tokens` as a row each."""
    tokens = np.asarray(tokens)
    column = list_array(tokens, lengths, pa.from_numpy_dtype(tokens.dtype))
    # Neither a row nor an id is ever null, and the schema says so: Parquet then writes no definition levels (a
    # third of the write). No page statistics either: nobody filters token ids by their min and max (half the time).
    schema = pa.schema([pa.field(COLUMN, column.type, nullable=False)])
    pq.write_table(
        pa.Table.from_arrays([column], schema=schema),
        path,
        row_group_size=ROW_GROUP_DOCUMENTS,
        compression="none",
        use_dictionary=False,
        write_statistics=False,
    )


def read_documents(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A file's ids back to back and its documents' lengths."""
    column = pq.read_table(path, columns=[COLUMN])[COLUMN]
    return pc.list_flatten(column).to_numpy(), pc.list_value_length(column).to_numpy()
