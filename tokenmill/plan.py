"""The plan's shards as every stage reads them: a shard is a dict of plan.json (its id, its pieces of input
files, its bytes, and in a mixture its source); `Shards` holds a plan's many as columns. The partition stage
makes the plan (`tokenmill.partition`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from tokenmill.readers import Piece


class Shards(Sequence):
    """A plan's shards as columns (a pyarrow table, about 100 bytes a shard), read as the list of dicts that
    plan.json holds: each shard is a dict only while it is used. As a list of dicts they are 0.8 KB a shard,
    80 MB at 100,000 shards, held by the flow all run long. (Validate's items, one per shard, are held the same
    way.)"""

    ROWS_AT_ONCE = 10_000  # shards made into dicts at a time, iterating

    def __init__(self, shards: list[dict] | pa.Table):
        self.table = shards if isinstance(shards, pa.Table) else pa.Table.from_pylist(shards)

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return Shards(self.table.slice(start, max(stop - start, 0)))
            return Shards(self.table.take(list(range(start, stop, step))))
        if not -len(self) <= index < len(self):
            raise IndexError(f"shard index {index} out of range ({len(self)} shards)")
        return self.table.slice(index % len(self), 1).to_pylist()[0]

    def __iter__(self) -> Iterator[dict]:
        for batch in self.table.to_batches(self.ROWS_AT_ONCE):
            yield from batch.to_pylist()

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Shards({len(self)} shards)"


def mix_sources(shards: Sequence) -> list[str]:
    """The mixture sources the shards hold, in order (empty for a single input, or items that are not shards),
    read off the column where they are `Shards`."""
    if isinstance(shards, Shards):
        table = shards.table
        return table["mix_source"].unique().to_pylist() if "mix_source" in table.column_names else []
    return list(dict.fromkeys(s["mix_source"] for s in shards if isinstance(s, dict) and "mix_source" in s))


def shard_ids(shards: Sequence[dict]) -> np.ndarray:
    """The shards' ids (8 bytes a shard), read off the column where they are `Shards`."""
    if isinstance(shards, Shards):
        return shards.table["shard_id"].to_numpy()
    return np.array([s["shard_id"] for s in shards], dtype=np.int64)


def shard_pieces(shard: dict) -> list[Piece]:
    return [Piece(**p) for p in shard["pieces"]]
