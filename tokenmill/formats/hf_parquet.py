"""Documents' token ids as Parquet for HF `datasets` (`load_dataset("parquet", data_dir=...)`, map-style or
streaming), both directions: a row per document, its ids (EOD last where the run appends it) in `input_ids`, a
list of the Megatron `.bin`'s dtype (uint16, or int32 for vocabularies of 65,500 and more), which `datasets` reads
as `List(Value("uint16"))`.

Written here rather than by a Parquet library, because the ids need no encoding at all: the column is
dictionary-encoded with the vocabulary as its dictionary (entry *i* is id *i*), so a data page's values are the
ids themselves as dictionary indices, bit-packed at the `.bin`'s width (16 or 32 bits), which is the `.bin`'s bytes
as they are. The rest is a few bytes per document: each list's repetition and definition levels (run-length
encoded), and the page and file metadata (Thrift's compact protocol). Libraries' writers encode every value
again (polars 75 ms per 16M tokens, pyarrow 220 ms; uint16 stored in 4 bytes, a file twice the `.bin`); this
writes the file at the speed of copying the `.bin`, and half the size. Every reader of Parquet reads it: tested with
pyarrow (which `datasets` reads with) and polars.

A row group holds up to `ROW_GROUP_DOCUMENTS` documents (what a streaming reader holds at once), a data page about
`PAGE_VALUES` ids, cut between documents; no statistics (nobody filters token ids by their min and max), no
compression (ids hardly compress)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokenmill.formats.table import Mixing, SplitFound, SplitOut

COLUMN = "input_ids"
ROW_GROUP_DOCUMENTS = 65_536
PAGE_VALUES = 1 << 20
MAGIC = b"PAR1"

# parquet.thrift's enums
INT32, REQUIRED, REPEATED, LIST, UINT_16, INT_32 = 1, 0, 2, 3, 12, 17
PLAIN, RLE, RLE_DICTIONARY = 0, 3, 8
DATA_PAGE, DICTIONARY_PAGE = 0, 2
# Thrift's compact protocol: the type of each field
BOOL_TRUE, BOOL_FALSE, I8, I32, I64, BINARY, THRIFT_LIST, STRUCT = 1, 2, 3, 5, 6, 8, 9, 12


def write(out: SplitOut) -> None:
    with out.store.writing_file(out.rels[0], out.files, read_again=False) as file:
        write_parquet(file, out.tokens, out.lengths, out.vocab_size)


def check(found: SplitFound) -> list[str]:
    """A row per document of the split, its tokens, of the `.bin`'s dtype."""
    meta = pq.ParquetFile(found.paths[0]).metadata
    tokens = sum(meta.row_group(i).column(0).num_values for i in range(meta.num_row_groups))
    type_ok = pq.read_schema(found.paths[0]).field(COLUMN).type.value_type == pa.from_numpy_dtype(found.dtype)
    return (
        []
        if meta.num_rows == found.row.documents and tokens == found.row.tokens and type_ok
        else [found.not_the_split()]
    )


def mix(mixing: Mixing) -> dict:
    """`interleave_datasets` draws rows, which are documents: each folder's probability is its share of the tokens
    over its documents' mean length."""
    made = mixing.made
    per_document = {
        name: share * made[name]["documents"] / made[name]["tokens"] for name, share in mixing.shares.items()
    }
    total = sum(per_document.values())
    return {"data_dirs": list(mixing.folders.values()), "probabilities": [p / total for p in per_document.values()]}


def write_parquet(file: str | Path | BinaryIO, tokens: np.ndarray, lengths: np.ndarray, vocab_size: int) -> None:
    """Documents of `lengths` tokens back to back in `tokens` (uint16 or int32 ids under `vocab_size`) as a row each,
    into `file` (a path, or open)."""
    if isinstance(file, str | Path):
        with open(file, "wb") as f:
            return write_parquet(f, tokens, lengths, vocab_size)
    tokens, lengths = np.ascontiguousarray(tokens), np.asarray(lengths, dtype=np.int64)
    little = tokens.dtype.newbyteorder("<")
    tokens = tokens.astype(little, copy=False)
    ends = np.cumsum(lengths)
    out = _Counted(file)
    out.write(MAGIC)
    row_groups = []
    for first in range(0, len(lengths), ROW_GROUP_DOCUMENTS):
        last = min(first + ROW_GROUP_DOCUMENTS, len(lengths))
        row_groups.append(_write_row_group(out, tokens, lengths, ends, first, last, vocab_size))
    footer = _footer(tokens.dtype, len(lengths), row_groups)
    out.write(footer + len(footer).to_bytes(4, "little") + MAGIC)


class _Counted:
    """A file being written, and how many bytes so far (the pages' offsets go into the footer)."""

    def __init__(self, file: BinaryIO):
        self.file, self.offset = file, 0

    def write(self, data) -> None:
        self.file.write(data)
        self.offset += memoryview(data).nbytes


def _write_row_group(out: _Counted, tokens, lengths, ends, first: int, last: int, vocab_size: int) -> bytes:
    """Documents `first` to `last` as a row group: its column chunk's dictionary page, then its data pages. Returns
    the row group's metadata."""
    start = out.offset
    dictionary = np.arange(vocab_size, dtype="<i4").tobytes()
    out.write(_page_header(DICTIONARY_PAGE, len(dictionary), _struct((1, I32, vocab_size), (2, I32, PLAIN))))
    out.write(dictionary)
    data_start, levels = out.offset, 0
    begin = int(ends[first - 1]) if first else 0
    # Pages cut between documents, about PAGE_VALUES ids each (a longer document is a page of its own).
    cuts = np.searchsorted(ends[first:last], begin + np.arange(PAGE_VALUES, int(ends[last - 1]) - begin, PAGE_VALUES))
    bounds = [first, *sorted(set((first + cuts).tolist()) - {first, last}), last]
    for a, b in itertools.pairwise(bounds):
        low, high = (int(ends[a - 1]) if a else 0), int(ends[b - 1])
        levels += _write_page(out, tokens[low:high], lengths[a:b])
    size = out.offset - start
    column = _struct(
        (1, I32, INT32),
        (2, (THRIFT_LIST, I32), [PLAIN, RLE, RLE_DICTIONARY]),
        (3, (THRIFT_LIST, BINARY), [COLUMN.encode(), b"list", b"element"]),
        (4, I32, 0),  # uncompressed
        (5, I64, levels),
        (6, I64, size),
        (7, I64, size),
        (9, I64, data_start),
        (11, I64, start),
    )
    chunk = _struct((2, I64, start), (3, STRUCT, column))
    return _struct((1, (THRIFT_LIST, STRUCT), [chunk]), (2, I64, size), (3, I64, last - first), (5, I64, start),
                   (6, I64, size))  # fmt: skip


def _write_page(out: _Counted, tokens: np.ndarray, lengths: np.ndarray) -> int:
    """One data page of documents of `lengths` tokens (back to back in `tokens`); returns its levels' count. An empty
    document is one level (repetition 0, definition 0) and no value; a document of n ids is n levels and values."""
    entries = np.maximum(lengths, 1)
    # Repetition: 0 where a document starts, 1 for the rest of its ids. Definition: 1 for an id, 0 for an empty list.
    repetition = _runs(np.stack([np.ones_like(entries), entries - 1], 1).ravel(), np.tile([0, 1], len(entries)))
    definition = _runs(entries, (lengths > 0).astype(np.int64))
    width = tokens.dtype.itemsize * 8
    padding = b"\0" * (-len(tokens) % 8 * tokens.dtype.itemsize)  # bit-packed runs hold groups of 8 values
    values = bytes([width]) + _varint((-(-len(tokens) // 8) << 1) | 1)
    body = (len(repetition).to_bytes(4, "little") + repetition + len(definition).to_bytes(4, "little") + definition
            + values)  # fmt: skip
    size = len(body) + tokens.nbytes + len(padding)
    levels = int(entries.sum())
    out.write(_page_header(DATA_PAGE, size, _struct((1, I32, levels), (2, I32, RLE_DICTIONARY), (3, I32, RLE),
                                                    (4, I32, RLE)), field=5))  # fmt: skip
    out.write(body)
    out.write(tokens)
    out.write(padding)
    return levels


def _runs(counts: np.ndarray, values: np.ndarray) -> bytes:
    """Levels of one bit as the RLE hybrid's run-length runs: `counts[i]` times `values[i]`, each run the varint of
    its length (shifted left one) and a byte of its value; empty runs left out, runs of one value merged."""
    keep = counts > 0
    counts, values = counts[keep], values[keep]
    if len(counts) == 0:
        return b""
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    counts, values = np.add.reduceat(counts, starts), values[starts]
    headers = counts.astype(np.uint64) << np.uint64(1)
    sizes = np.ones(len(headers), dtype=np.int64)  # varint bytes of each header
    for shift in (7, 14, 21, 28, 35):
        sizes += headers >= np.uint64(1 << shift)
    offsets = np.cumsum(sizes + 1) - (sizes + 1)
    encoded = np.zeros(int((sizes + 1).sum()), dtype=np.uint8)
    for k in range(int(sizes.max())):
        has = sizes > k
        byte = (headers[has] >> np.uint64(7 * k)) & np.uint64(0x7F)
        encoded[offsets[has] + k] = byte | np.where(sizes[has] > k + 1, 0x80, 0).astype(np.uint64)
    encoded[offsets + sizes] = values
    return encoded.tobytes()


def _page_header(kind: int, size: int, header: bytes, field: int = 7) -> bytes:
    """A page's header: its type and size (uncompressed: both sizes the same), then its kind's own header as `field`
    (5: a data page's, 7: a dictionary page's)."""
    return _struct((1, I32, kind), (2, I32, size), (3, I32, size), (field, STRUCT, header))


def _footer(dtype: np.dtype, rows: int, row_groups: list[bytes]) -> bytes:
    """The file's metadata: its schema (a required list of required ids) and its row groups."""
    uint16 = dtype == np.uint16
    integer = _struct((1, I8, 16 if uint16 else 32), (2, BOOL_FALSE if uint16 else BOOL_TRUE, None))
    schema = [
        _struct((4, BINARY, b"schema"), (5, I32, 1)),
        _struct(
            (3, I32, REQUIRED),
            (4, BINARY, COLUMN.encode()),
            (5, I32, 1),
            (6, I32, LIST),
            (10, STRUCT, _struct((3, STRUCT, b"\0"))),
        ),
        _struct((3, I32, REPEATED), (4, BINARY, b"list"), (5, I32, 1)),
        _struct(
            (1, I32, INT32),
            (3, I32, REQUIRED),
            (4, BINARY, b"element"),
            (6, I32, UINT_16 if uint16 else INT_32),
            (10, STRUCT, _struct((10, STRUCT, integer))),
        ),
    ]
    return _struct((1, I32, 2), (2, (THRIFT_LIST, STRUCT), schema), (3, I64, rows),
                   (4, (THRIFT_LIST, STRUCT), row_groups), (6, BINARY, b"tokenmill"))  # fmt: skip


def _struct(*fields) -> bytes:
    """A Thrift struct in the compact protocol, of `(id, type, value)` fields in increasing id order; a list's type
    is `(THRIFT_LIST, element type)`, a struct's value its encoded bytes, a bool's type BOOL_TRUE or BOOL_FALSE."""
    encoded, last = bytearray(), 0
    for field, kind, value in fields:
        wire = kind[0] if isinstance(kind, tuple) else kind
        encoded.append((field - last) << 4 | wire)  # every gap here is under 16
        last = field
        if isinstance(kind, tuple):
            element = kind[1]
            encoded.append(len(value) << 4 | element if len(value) < 15 else 0xF0 | element)
            if len(value) >= 15:
                encoded += _varint(len(value))
            for item in value:
                encoded += _value(element, item)
        elif kind not in (BOOL_TRUE, BOOL_FALSE):
            encoded += _value(kind, value)
    return bytes(encoded + b"\0")


def _value(kind: int, value) -> bytes:
    if kind in (I32, I64):
        return _varint((value << 1) ^ (value >> 63))  # zigzag
    if kind == I8:
        return bytes([value & 0xFF])
    if kind == BINARY:
        return _varint(len(value)) + value
    return value  # a struct, encoded


def _varint(n: int) -> bytes:
    encoded = bytearray()
    while n >= 0x80:
        encoded.append(n & 0x7F | 0x80)
        n >>= 7
    encoded.append(n)
    return bytes(encoded)


def read_documents(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A file's ids back to back and its documents' lengths."""
    column = pq.read_table(path, columns=[COLUMN])[COLUMN]
    return pc.list_flatten(column).to_numpy(), pc.list_value_length(column).to_numpy()
