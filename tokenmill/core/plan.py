"""The plan as every stage reads it: `Plan` (plan.json in the output), its `Shards`, each a `Shard` (its id, its
pieces of input files, their bytes, what its output is made from, and in a mixture its source). The partition
stage makes the plan (`tokenmill.stages.partition`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from tokenmill.core import layout
from tokenmill.io.readers import Piece

if TYPE_CHECKING:
    from tokenmill.io.storage import Store


@dataclass(frozen=True)
class Shard:
    """A shard of the plan: the unit every shard stage works on, retries and commits."""

    shard_id: int
    pieces: tuple[Piece, ...]
    bytes: int  # uncompressed input bytes
    source: str  # what its output is made from: a hash of its pieces and their files' fingerprints (not its id)
    mix_source: str = ""  # the mixture source its files belong to ("" for a single input)

    @classmethod
    def from_json(cls, data: dict) -> Shard:
        pieces = tuple(Piece(**piece) for piece in data["pieces"])
        return cls(data["shard_id"], pieces, data["bytes"], data.get("source", ""), data.get("mix_source") or "")

    def to_json(self) -> dict:
        """As plan.json holds it (a mixture source only in a mixture)."""
        data = {"shard_id": self.shard_id, "pieces": [p.to_json() for p in self.pieces], "bytes": self.bytes}
        return data | ({"mix_source": self.mix_source} if self.mix_source else {}) | {"source": self.source}


class Columns(Sequence):
    """Items held as the columns of a pyarrow table (about 100 bytes a shard), each made into an object (`item`)
    only while it is used: as objects, a plan's shards are 0.8 KB each, 80 MB at 100,000 shards, held by the
    flow all run long (so are validate's items, one per shard)."""

    ROWS_AT_ONCE = 10_000  # items made into objects at a time, iterating

    def __init__(self, rows: Sequence | pa.Table = ()):
        if not isinstance(rows, pa.Table):
            rows = pa.Table.from_pylist([r.to_json() if hasattr(r, "to_json") else r for r in rows])
        self.table = rows

    @staticmethod
    def item(row: dict):
        return row

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return type(self)(self.table.slice(start, max(stop - start, 0)))
            return type(self)(self.table.take(list(range(start, stop, step))))
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range ({len(self)} items)")
        return self.item(self.table.slice(index % len(self), 1).to_pylist()[0])

    def __iter__(self) -> Iterator:
        for batch in self.table.to_batches(self.ROWS_AT_ONCE):
            yield from map(self.item, batch.to_pylist())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)})"


class Shards(Columns):
    """A plan's shards (`Shard`), as columns."""

    item = staticmethod(Shard.from_json)

    def to_json(self) -> list[dict]:
        return self.table.to_pylist()  # each as `Shard.to_json` makes it: the table was made of those


def mix_sources(items: Sequence) -> list[str]:
    """The mixture sources the shards hold, in order (empty for a single input, or items that are not shards),
    read off the column where they are `Shards`."""
    if isinstance(items, Shards):
        table = items.table
        return table["mix_source"].unique().to_pylist() if "mix_source" in table.column_names else []
    return list(dict.fromkeys(s.mix_source for s in items if isinstance(s, Shard) and s.mix_source))


def shard_ids(shards: Sequence[Shard]) -> np.ndarray:
    """The shards' ids (8 bytes a shard), read off the column where they are `Shards`."""
    if isinstance(shards, Shards):
        return shards.table["shard_id"].to_numpy() if len(shards) else np.array([], dtype=np.int64)
    return np.array([s.shard_id for s in shards], dtype=np.int64)


@dataclass(frozen=True)
class Plan:
    """The shards of a run's input and how they were made (plan.json): kept while the input and the partition
    config are as it recorded them, so that a rerun or a retry sees the same shards."""

    key: str  # the input files as they are now and the partition config: a plan is reused while it is the same
    config_key: str  # the input and partition config alone
    inputs: str  # the input files as they are now (their URLs and fingerprints)
    shard_size: int  # the shards' size, an `auto` size resolved
    shuffled_shards: int | None  # with the global shuffle, the output shards the input shards are scattered into
    files: list[dict]  # every input file with its fingerprint and uncompressed bytes (and mixture source)
    shards: Shards

    @classmethod
    def read(cls, store: Store) -> Plan | None:
        """The plan an output holds, if any."""
        return cls.from_json(store.read_json(layout.PLAN)) if store.exists(layout.PLAN) else None

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        return cls(
            data["key"], data.get("config_key", ""), data.get("inputs", ""), data["shard_size"],
            data.get("shuffled_shards"), data["files"], Shards(data["shards"]),
        )  # fmt: skip

    def to_json(self) -> dict:
        return {**{k: v for k, v in vars(self).items() if k != "shards"}, "shards": self.shards.to_json()}

    def __repr__(self) -> str:  # not its files and shards: a task's parameters in the UI
        return f"Plan({len(self.shards)} shards of {self.shard_size} bytes over {len(self.files)} files)"
