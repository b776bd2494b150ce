"""litdata's optimized chunks of tokens, as LitGPT's pretraining data reads them (`litdata.StreamingDataset` with
`TokensLoader(block_size)`), both directions: what litdata's `BinaryWriter` writes for `TokensLoader`.

A chunk is a little-endian uint32 item count `N`, then `N + 1` uint32 byte offsets of the items from the file's start
(the first is the header's size, `4 * (N + 2)`), then the items back to back with no header of their own
(`no_header_numpy`). Here an item is a document, so the offsets are the chunk's document index; `TokensLoader`
ignores them and reads the chunk's ids as one stream, in blocks that never cross a chunk. The ids are the Megatron
`.bin`'s bytes. The offsets being uint32, a chunk is under 4 GiB.

The folder's `index.json` lists every chunk (its bytes, items and tokens) and the dtype, litdata's numpy dtype code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tokenmill.formats.table import Mixing, SplitFound, SplitOut

# litdata.constants._NUMPY_DTYPES_MAPPING: the code of each dtype in `data_format`
NUMPY_DTYPE_CODES = {
    np.dtype(name): code
    for code, name in enumerate(["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"])
}
# The pytree spec of an item that is one array (litdata's `data_spec`, as `BinaryWriter` records it).
ONE_ARRAY_SPEC = json.dumps([1, {"type": None, "context": None, "children_spec": []}])
MAX_CHUNK_BYTES = 2**32 - 1


class CorruptChunk(ValueError):
    """A chunk that is not what its split's stats say (message names the file)."""


def write(out: SplitOut) -> None:
    with out.store.writing_file(out.rels[0], out.files, read_again=False) as file:
        write_chunk(file, out.tokens, out.lengths, name=out.rels[0])


def check(found: SplitFound) -> list[str]:
    """The split's tokens and documents, the chunk's offsets checked against its size."""
    try:
        tokens, lengths = read_chunk(found.paths[0], found.dtype, name=found.rels[0])
    except CorruptChunk as e:
        return [str(e)]
    wrong = len(tokens) != found.row.tokens or len(lengths) != found.row.documents
    return [found.not_the_split()] if wrong else []


def split_index(shards: list[dict], dtype: np.dtype, seq_len: int) -> dict:
    """The folder's `index.json` over its shards' chunks (`filename`, `documents`, `tokens` each)."""
    return index(shards, dtype)


def mix(mixing: Mixing) -> dict:
    """A `CombinedStreamingDataset` over a `StreamingDataset` per folder, and their weights."""
    return {"input_dirs": list(mixing.folders.values()), "weights": list(mixing.shares.values())}


def header_bytes(documents: int) -> int:
    return 4 * (documents + 2)


def chunk_bytes(documents: int, tokens: int, dtype: np.dtype) -> int:
    return header_bytes(documents) + tokens * np.dtype(dtype).itemsize


def write_chunk(file: BinaryIO, tokens: np.ndarray, lengths: np.ndarray, *, name: str) -> None:
    """One chunk (`file`, open) of documents of `lengths` tokens back to back in `tokens`; `name` is how an error
    names it."""
    size = chunk_bytes(len(lengths), len(tokens), tokens.dtype)
    if size > MAX_CHUNK_BYTES:
        raise ValueError(f"{name}: {size} bytes, over litdata's 4 GiB a chunk (its offsets are uint32): smaller shards")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    offsets = offsets * tokens.dtype.itemsize + header_bytes(len(lengths))
    file.write(np.uint32(len(lengths)).astype("<u4").tobytes())
    file.write(offsets.astype("<u4").tobytes())
    file.write(np.ascontiguousarray(tokens))


def read_chunk(path: str | Path, dtype: np.dtype, *, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A chunk's ids and its documents' lengths, after checking its offsets against its size."""
    if (size := Path(path).stat().st_size) < 8:
        raise CorruptChunk(f"{name}: {size} bytes, shorter than a chunk's header")
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    documents = int(raw[:4].view("<u4")[0])
    offsets = np.asarray(raw[4 : header_bytes(documents)].view("<u4"), dtype=np.int64)
    if len(offsets) != documents + 1 or offsets[0] != header_bytes(documents) or offsets[-1] != len(raw):
        raise CorruptChunk(f"{name}: its offsets do not span its {len(raw)} bytes")
    tokens = raw[offsets[0] :].view(np.dtype(dtype).newbyteorder("<"))
    return tokens, np.diff(offsets) // np.dtype(dtype).itemsize


def index(chunks: list[dict], dtype: np.dtype) -> dict:
    """A folder's `index.json`, of its chunks: `{"filename", "documents", "tokens"}` each, in reading order."""
    entries = [
        {
            "chunk_bytes": chunk_bytes(c["documents"], c["tokens"], dtype),
            "chunk_size": c["documents"],
            "dim": c["tokens"],
            "filename": c["filename"],
        }
        for c in chunks
    ]
    config = {
        "chunk_bytes": max((e["chunk_bytes"] for e in entries), default=0),
        "chunk_size": None,
        "compression": None,
        "compression_batch_size": None,
        "compression_level": None,
        "data_format": [f"no_header_numpy:{NUMPY_DTYPE_CODES[np.dtype(dtype)]}"],
        "data_spec": ONE_ARRAY_SPEC,
        "encryption": None,
        "ipc_compression": None,
        "item_loader": "TokensLoader",
    }
    return {"chunks": entries, "config": config, "updated_at": "0"}
