"""MosaicML streaming's MDS shards of token rows, as llm-foundry's pretokenized text dataset reads them
(`StreamingTextDataset`: a `tokens` column, each sample `max_seq_len` ids of documents joined by their EOD), both
directions: what streaming's `MDSWriter` writes for one static-shape column `ndarray:<dtype>:<seq_len>`.

A shard is a little-endian uint32 sample count `N`, `N + 1` uint32 byte offsets of the samples from the file's
start, the shard's config (JSON, sorted keys), then the samples: each a row's ids and nothing else (a static-shape
column has no size or shape header). A row is `seq_len` ids of the Megatron `.bin` cut in order; rows never cross a
shard, so a shard's last `tokens % seq_len` ids are in no row. The offsets being uint32, a shard is under 4 GiB.

The folder's `index.json` lists every shard (its bytes and samples) with the same config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tokenmill.formats.table import Mixing, SplitFound, SplitOut

MAX_SHARD_BYTES = 2**32 - 1
COLUMN = "tokens"  # llm-foundry's


class CorruptShard(ValueError):
    """An MDS shard that is not what its split's stats say (message names the file)."""


def write(out: SplitOut) -> None:
    with out.store.writing_file(out.rels[0], out.files, read_again=False) as file:
        write_shard(file, out.tokens, out.seq_len, name=out.rels[0])


def check(found: SplitFound) -> list[str]:
    """The rows of `seq_len` tokens that the split's tokens make."""
    try:
        rows = len(read_rows(found.paths[0], found.dtype, found.seq_len, name=found.rels[0]))
    except CorruptShard as e:
        return [str(e)]
    if rows != (expected := rows_of(found.row.tokens, found.seq_len)):
        return [f"{found.rels[0]}: {rows} rows of {found.seq_len} tokens, {found.row.tokens} tokens make {expected}"]
    return []


def split_index(shards: list[dict], dtype: np.dtype, seq_len: int) -> dict:
    """The folder's `index.json` over its shards (`filename`, `tokens` each). A shard of fewer tokens than a row has
    no sample, which streaming's index cannot list."""
    rows = [(s["filename"], rows_of(s["tokens"], seq_len)) for s in shards]
    return index([{"filename": name, "rows": n} for name, n in rows if n], dtype, seq_len)


def mix(mixing: Mixing) -> dict:
    """llm-foundry's streams, each a folder and its proportion."""
    where = "remote" if mixing.remote else "local"
    return {
        "streams": {name: {where: folder, "proportion": mixing.shares[name]} for name, folder in mixing.folders.items()}
    }


def config(dtype: np.dtype, seq_len: int) -> dict:
    """A shard's config, as `MDSWriter.get_config()` has it for the one `tokens` column."""
    return {
        "column_encodings": [f"ndarray:{np.dtype(dtype).name}:{seq_len}"],
        "column_names": [COLUMN],
        "column_sizes": [seq_len * np.dtype(dtype).itemsize],
        "compression": None,
        "format": "mds",
        "hashes": [],
        "size_limit": None,
        "version": 2,
    }


def _config_bytes(dtype: np.dtype, seq_len: int) -> bytes:
    return json.dumps(config(dtype, seq_len), sort_keys=True).encode()


def rows_of(tokens: int, seq_len: int) -> int:
    return tokens // seq_len


def shard_bytes(rows: int, dtype: np.dtype, seq_len: int) -> int:
    row_bytes = seq_len * np.dtype(dtype).itemsize
    return 4 * (rows + 2) + len(_config_bytes(dtype, seq_len)) + rows * row_bytes


def write_shard(file: BinaryIO, tokens: np.ndarray, seq_len: int, *, name: str) -> int:
    """The rows of `tokens` as one shard (`file`, open); its rows. `name` is how an error names it."""
    dtype, rows = tokens.dtype, rows_of(len(tokens), seq_len)
    if (size := shard_bytes(rows, dtype, seq_len)) > MAX_SHARD_BYTES:
        raise ValueError(f"{name}: {size} bytes, over MDS's 4 GiB a shard (its offsets are uint32): smaller shards")
    header = 4 * (rows + 2) + len(_config_bytes(dtype, seq_len))
    offsets = header + np.arange(rows + 1, dtype=np.int64) * seq_len * dtype.itemsize
    file.write(np.uint32(rows).astype("<u4").tobytes())
    file.write(offsets.astype("<u4").tobytes())
    file.write(_config_bytes(dtype, seq_len))
    file.write(np.ascontiguousarray(tokens[: rows * seq_len]))
    return rows


def read_rows(path: str | Path, dtype: np.dtype, seq_len: int, *, name: str) -> np.ndarray:
    """A shard's rows (rows x seq_len), after checking its header and size against the config it must have."""
    size = Path(path).stat().st_size
    raw = np.memmap(path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
    rows = int(raw[:4].view("<u4")[0]) if size >= 4 else -1
    if rows < 0 or size != shard_bytes(rows, dtype, seq_len):
        raise CorruptShard(f"{name}: {size} bytes, not an MDS shard of {seq_len}-token {np.dtype(dtype)} rows")
    start = 4 * (rows + 2)
    if bytes(raw[start : start + len(cfg := _config_bytes(dtype, seq_len))]) != cfg:
        raise CorruptShard(f"{name}: its config is not {cfg.decode()}")
    return raw[start + len(cfg) :].view(np.dtype(dtype).newbyteorder("<")).reshape(rows, seq_len)


def index(shards: list[dict], dtype: np.dtype, seq_len: int) -> dict:
    """A folder's `index.json`, of its shards: `{"filename", "rows"}` each, in reading order."""
    return {
        "shards": [
            config(dtype, seq_len)
            | {
                "raw_data": {"basename": s["filename"], "bytes": shard_bytes(s["rows"], dtype, seq_len), "hashes": {}},
                "samples": s["rows"],
                "zip_data": None,
            }
            for s in shards
        ],
        "version": 2,
    }
