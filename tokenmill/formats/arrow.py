"""Token ids as Arrow list columns, for the layouts written with pyarrow (`trl`, `megatron_bridge`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def list_array(values: np.ndarray, lengths: np.ndarray, type: pa.DataType) -> pa.ListArray:
    """`values` cut into lists of `lengths` as one Arrow column, from the flat array (no Python object per list)."""
    if len(values) >= 2**31:
        raise ValueError(f"{len(values)} values do not fit one Arrow list column (int32 offsets): smaller shards")
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    of_type = pa.list_(pa.field("element", type, nullable=False))  # no value is null (Parquet: no level to say so)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=type), type=of_type)


def packed_tokens_problem(found, column: str, rows_counted: bool) -> list[str]:
    """A Parquet layout of conversations or pairs (`found`: `table.SplitFound`) against the split's packed tokens
    (and, `rows_counted`, its packed rows): its `column`'s ids counted."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table, row = pq.read_table(found.paths[0]), found.row
    if column == "prompt_ids":  # a pair's prompt is in both of its packed sequences
        counts = [int(pc.sum(pc.list_value_length(table[c])).as_py() or 0) for c in table.column_names]
        tokens = 2 * counts[0] + sum(counts[1:])
    else:
        tokens = int(pc.sum(pc.list_value_length(table[column])).as_py() or 0)
    if tokens != row.packed_real_tokens or (rows_counted and len(table) != row.packed_rows):
        return [f"{found.rels[0]}: {tokens} tokens in {len(table)} rows, stats say {row.packed_real_tokens}"]
    return []
