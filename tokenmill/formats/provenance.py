"""The documents table beside each shard's split, both directions: `megatron/<split>/shard-NNNNN.docs.parquet`
(`layout.documents_table`), a row per document of the split's `.bin`, in its order (row i is sequence i of the
`.idx`, of OLMo's `.csv.gz`, datatrove's `.ds.index`, ...), saying where the document came from and where its tokens
lie. Written by the tokenize pass from what it holds in memory (no second read of the input): a batch's ids, files,
lines and token lengths become a few arrow columns, no Python object per document where the fast path read them.

Columns (COLUMNS), then the configured metadata fields (`input.metadata_fields`) as strings:
- `id`: the document id (`input.id_field`, else `<file name>:<line or row>`);
- `source`: the mixture source it belongs to ("" for a single input);
- `file`: its input file, the path as the plan lists it (`plan.json`);
- `line`: its line in that file (JSONL, and plain text: the document's first line), or its row (Parquet), from 1;
- `split`: the split (`<source>/<split>` in a mixture), the directory of its `.bin`;
- `token_offset`, `token_length`: where its tokens lie in the split's `.bin` of that shard, in tokens (BOS and EOD
  included).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenmill.core.layout import DOCUMENTS_COLUMNS
from tokenmill.io.readers import Batch, LineIds

COLUMNS = DOCUMENTS_COLUMNS  # named in layout, which config reads too


def batch_origins(batch: Batch, metadata_fields: Sequence[str]) -> pa.Table:
    """Where each document of a batch came from: its id, file, line and metadata fields."""
    columns = {
        "id": _ids(batch.ids),
        "file": pa.array(batch.doc_files, pa.string()).dictionary_encode(),  # a batch is of one file, or a few
        "line": pa.array(np.asarray(batch.doc_lines, dtype=np.int64)),
    }
    return pa.table(columns | {name: _strings(batch.extra[name]) for name in metadata_fields})


def split_rows(origins: pa.Table, chosen: np.ndarray | None, lengths: np.ndarray, first_offset: int, source: str,
               split: str) -> pa.Table:  # fmt: skip
    """The rows of a batch's documents that went to `split` (`chosen`: a mask of `origins`' rows, None: all),
    whose token lengths are `lengths` and whose first starts at token `first_offset` of the split's `.bin`."""
    if chosen is not None:
        origins = origins.filter(pa.array(chosen))
    n = len(lengths)
    placed = {
        "source": _repeated(source, n),
        "split": _repeated(split, n),
        "token_offset": pa.array(first_offset + np.cumsum(lengths, dtype=np.int64) - lengths),
        "token_length": pa.array(np.asarray(lengths, dtype=np.int32)),
    }
    extra = [name for name in origins.column_names if name not in COLUMNS]
    return pa.table({name: placed[name] if name in placed else origins[name] for name in (*COLUMNS, *extra)})


def numbered(table: pa.Table, first_line: int, line_ids: bool) -> pa.Table:
    """A documents table of one piece of a file whose lines were counted from the piece's start, with its lines
    counted from the file's (`first_line`: the piece's first); and with `line_ids` (no `input.id_field`), its ids
    `<file>:<line>` too, which held the same count."""
    lines = pc.add(table.column("line"), first_line - 1)
    table = table.set_column(table.schema.get_field_index("line"), "line", lines)
    if not line_ids or not table.num_rows:
        return table
    name = table.column("id")[0].as_py().rsplit(":", 1)[0]  # a piece is of one file
    return table.set_column(table.schema.get_field_index("id"), "id", _ids(LineIds(name, lines.to_numpy())))


def _ids(ids: Sequence[str]) -> pa.Array:
    """The batch's ids as arrow strings; the fast path's `<file>:<line>` made by arrow, not one Python string each."""
    if isinstance(ids, LineIds):
        lines = pc.cast(pa.array(ids.lines), pa.string())
        return pc.binary_join_element_wise(ids.name, lines, ":")
    return pa.array(ids, pa.string())


def _repeated(value: str, n: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value]))


def _strings(values: list) -> pa.Array:
    """A metadata field's values as strings: the fast path reads them so; the careful path keeps JSON's types (a
    score 0.5 is "0.5", an object its JSON text), so every shard's column has one type."""
    try:
        return pa.array(values, pa.string())
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        return pa.array([v if v is None or isinstance(v, str) else orjson.dumps(v).decode() for v in values])


def write_documents_table(path: str | Path, tables: list[pa.Table]) -> None:
    """A split's rows (`split_rows`, in the order its documents went into the `.bin`) as one Parquet file."""
    table = pa.concat_tables(tables).combine_chunks() if len(tables) > 1 else tables[0]
    # Half the write's time is statistics and dictionaries of columns that gain nothing from them (ids, lines and
    # offsets are unique); files, sources and splits repeat, and keep their dictionaries.
    pq.write_table(table, path, compression="zstd", write_statistics=False, use_dictionary=["file", "source", "split"])


def read_documents_table(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    return pq.read_table(path, columns=list(columns) if columns is not None else None)


def tiling_problem(table: pa.Table, lengths: np.ndarray, split: str, name: str) -> str | None:
    """What is wrong with a split's documents table (`name`, its `split`, token_offset and token_length at least)
    against its `.idx` `lengths`: a row per sequence, of that split, whose offsets and lengths tile the `.bin`; None
    where nothing is."""
    if missing := [c for c in ("split", "token_offset", "token_length") if c not in table.column_names]:
        return f"{name}: no column {missing[0]!r}"
    if table.num_rows != len(lengths):
        return f"{name}: {table.num_rows} rows, the .idx has {len(lengths)} documents"
    if table.num_rows and pc.any(pc.not_equal(table.column("split").cast(pa.string()), split)).as_py():
        return f"{name}: rows of another split than {split!r}"
    offsets, sizes = (table.column(c).to_numpy() for c in ("token_offset", "token_length"))
    wrong = (offsets != np.cumsum(lengths, dtype=np.int64) - lengths) | (sizes != lengths)
    if wrong.any():
        bad = int(np.flatnonzero(wrong)[0])
        return f"{name}: row {bad}'s token_offset and token_length are not document {bad}'s place in the .bin"
    return None
