"""A shard's tokenize and pack results (`Tokenized`, `Packed`: what their commit markers record), and the stats
table made from them: a row per shard and split (documents in, rejected and kept, tokens, what was packed),
checked by validate, summed by publish and the report, drawn from by the mix; and the error a run ends with where
the counts or files say the dataset is not sound."""

from __future__ import annotations

import contextlib
from array import array
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import orjson
import pandas as pd

from tokenmill.core import layout
from tokenmill.io.readers import MISSING, few
from tokenmill.io.storage import Store

# supervised_tokens: of a conversations' split (input.chat), the tokens that carry loss, else -1; too_long and
# tokens_cut: its conversations longer than a packed row (dropped, truncated or split: pack.too_long), and the
# tokens left out of the packed rows; trainer_files: the files of the trainers' layouts (output.formats: trl,
# megatron_bridge, olmo)
COLUMNS = ["shard_id", "split", "documents_in", "rejected", "documents", "tokens", "max_token_id",
           "packed_rows", "packed_real_tokens", "packed_pad_tokens", "padded_layout_rows", "llmc_files",
           "supervised_tokens", "too_long", "tokens_cut", "trainer_files"]  # fmt: skip


_NOT_PACKED = {"rows": -1, "real_tokens": -1, "pad_tokens": -1, "padded_layout_rows": -1, "llmc_files": -1}


@dataclass(frozen=True)
class Committed:
    """A shard's result as its commit marker records it (`to_json`, `from_json`), and what this run found of it:
    `reused` (committed before, its files intact) and `redone` (what had changed in its committed files)."""

    reused: bool = field(default=False, kw_only=True)
    redone: str | None = field(default=None, kw_only=True)

    @classmethod
    def from_json(cls, data: dict, reused: bool = False, redone: str | None = None):
        known = {f.name for f in fields(cls)} - {"reused", "redone"}  # a marker of an earlier tokenmill may hold more
        return cls(**{k: v for k, v in data.items() if k in known}, reused=reused, redone=redone)

    def to_json(self) -> dict:
        data = asdict(self)
        del data["reused"], data["redone"]
        return {k: v for k, v in data.items() if v is not None}


@dataclass(frozen=True)
class Tokenized(Committed):
    """The tokenize stage's result for a shard."""

    shard_id: int
    source: str  # what the shard is made from (`Shard.source`)
    documents_in: int  # records read: documents and rejects
    rejected: int
    bytes_in: int
    splits: dict[str, dict]  # per split (stream): documents, tokens, max_token_id
    files_rejected: list[str] = field(default_factory=list)  # whole input files quarantined, and why
    unnumbered_rejects: int = 0  # rejects whose lines count from their piece's start (`tokenize.number_lines`)
    unnumbered_lines: bool = False  # its documents' lines count from its piece's start, too (`tokenize.number_lines`)
    lines: int | None = None  # a piece of a cut file: its lines, which number the pieces after it
    # Where each block the fast path read lies (see `tokenize_shard`), for validate's reference sample
    blocks: list[list[int]] | None = None
    encoder: str = ""
    rerouted_to_reference: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Packed(Committed):
    """The pack stage's result for a shard: per split, its rows, real and pad tokens, the rows a padded
    one-document-per-row layout would take, and its llm.c files."""

    shard_id: int
    splits: dict[str, dict]
    seconds: float = 0.0


class ValidationFailed(Exception):
    """The dataset is not sound; the message is the readable report."""


def all_rejected(store: Store, rows: pd.DataFrame) -> str:
    """What a person reads of stats rows (a row per shard and split) whose records were all rejected: how many,
    the first one's file, line and reason, and the rejects files that give each one's."""
    rejected = rows.groupby("shard_id").rejected.first()
    files = [layout.rejects_file(int(i)) for i in rejected.index[rejected > 0]]
    if not files:
        return "its files hold no records"
    with store.open(files[0]) as f:
        first = orjson.loads(f.readline())
    more = f" and {len(files) - 3} more" if len(files) > 3 else ""
    reason = first["reason"]
    if MISSING in reason and (keys := record_fields(first.get("record", ""))):
        reason += f" (its fields: {few(keys)})"
    return (
        f"all {int(rejected.sum()):,} records were rejected, the first at {first['file']} line {first['line']}: "
        f"{reason} (each one's file, line and reason: {', '.join(files[:3])}{more} in {store.url})"
    )


def record_fields(record: str) -> list[str]:
    """The top-level fields of a rejected record as its reject keeps it (none where it is not a whole JSON object,
    or was cut short)."""
    with contextlib.suppress(orjson.JSONDecodeError):
        if isinstance(parsed := orjson.loads(record), dict):
            return list(parsed)
    return []


def stats_rows(tokenized: Tokenized, packed: Packed) -> list[tuple]:
    """A shard's rows of the stats table (one per split), from its tokenize and pack results."""
    rows = []
    for split, c in tokenized.splits.items():
        p = _NOT_PACKED | packed.splits.get(split, {})
        rows.append(
            (
                tokenized.shard_id,
                split,
                tokenized.documents_in,
                tokenized.rejected,
                c["documents"],
                c["tokens"],
                c["max_token_id"],
                p["rows"],
                p["real_tokens"],
                p["pad_tokens"],
                p["padded_layout_rows"],
                p["llmc_files"],
                c.get("supervised", -1),
                p.get("too_long", 0),
                p.get("tokens_cut", 0),
                p.get("trainer_files", 0),
            )
        )
    return rows


def stats_table(tokenized: list[Tokenized], packed: list[Packed]) -> pd.DataFrame:
    """One row per shard and split, from the tokenize and pack stages' results."""
    packing = {p.shard_id: p for p in packed}
    return table_of([row for t in tokenized for row in stats_rows(t, packing.get(t.shard_id, Packed(t.shard_id, {})))])


def table_of(rows: list[tuple]) -> pd.DataFrame:
    """The stats table of rows as `stats_rows` makes them, in order of shard and split."""
    return pd.DataFrame(rows, columns=COLUMNS).sort_values(["shard_id", "split"], ignore_index=True)


class StatsColumns:
    """Rows as `stats_rows` makes them, added in any order and kept as columns: 8 bytes a number and 1 a split
    (a tuple of Python ints per row was about 0.4 KB); `table()` is `table_of` the rows."""

    def __init__(self):
        self.splits: dict[str, int] = {}  # each split's code, in order of first appearance
        self.split_codes = array("b")
        self.numbers = array("q")  # every column but the split, row after row

    def add(self, rows: list[tuple]) -> None:
        for row in rows:
            self.split_codes.append(self.splits.setdefault(row[1], len(self.splits)))
            self.numbers.append(row[0])
            self.numbers.extend(row[2:])

    def __len__(self) -> int:
        return len(self.split_codes)

    def table(self) -> pd.DataFrame:
        numbers = np.frombuffer(self.numbers, dtype=np.int64).reshape(len(self), len(COLUMNS) - 1)
        names = np.array(list(self.splits) or [""], dtype=object)
        columns = {"shard_id": numbers[:, 0], "split": names[np.frombuffer(self.split_codes, dtype=np.int8)]}
        columns |= {name: numbers[:, i] for i, name in enumerate(COLUMNS[2:], start=1)}
        return pd.DataFrame(columns, columns=COLUMNS).sort_values(["shard_id", "split"], ignore_index=True)


NOTHING_PACKED = {
    "rows": 0, "real_tokens": 0, "pad_tokens": 0, "padded_layout_rows": 0, "llmc_files": 0, "trainer_files": 0
}  # fmt: skip


def skipped(tokenized: Tokenized) -> Packed:
    """A shard's pack result where the stage has nothing to write (see `writes_files`)."""
    return Packed(tokenized.shard_id, {split: dict(NOTHING_PACKED) for split in tokenized.splits})


def packing_summary(r: pd.Series, seq_len: int) -> dict:
    """Packing stats of summed stats rows, beside what one document per padded row would have cost."""
    slots = r.packed_real_tokens + r.packed_pad_tokens
    padded_slots = r.padded_layout_rows * seq_len
    return {
        "sequences": int(r.packed_rows),
        "real_tokens": int(r.packed_real_tokens),
        "pad_tokens": int(r.packed_pad_tokens),
        "utilization": round(float(r.packed_real_tokens / slots), 6) if slots else None,
        "padded_layout": {
            "sequences": int(r.padded_layout_rows),
            "utilization": round(float(r.tokens / padded_slots), 6) if padded_slots else None,
        },
    }


def split_summary(table: pd.DataFrame, seq_len: int) -> dict:
    by_split = table.groupby("split").sum(numeric_only=True)
    summary = {
        split: {"documents": int(r.documents), "tokens": int(r.tokens), "packing": packing_summary(r, seq_len)}
        for split, r in by_split.iterrows()
    }
    for split, r in table[table.supervised_tokens >= 0].groupby("split").sum(numeric_only=True).iterrows():
        summary[split] |= conversations_summary(r)
    return summary


def conversations_summary(r: pd.Series) -> dict:
    """Of summed stats rows of conversations: the tokens that carry loss and their share, and the conversations
    longer than a packed row (dropped, truncated or split: pack.too_long) and the tokens that left the rows."""
    share = round(float(r.supervised_tokens / r.tokens), 6) if r.tokens else None
    return {
        "supervised_tokens": int(r.supervised_tokens),
        "supervised_share": share,
        "too_long": int(r.too_long),
        "tokens_cut": int(r.tokens_cut),
    }
