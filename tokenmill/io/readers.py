"""Reading documents out of input files: JSONL (plain, .gz, .zst; a .json file of one JSON array as the JSON Lines of
its records, `arrays`), Parquet and plain text.

A shard is a list of pieces; a piece is one file, a newline-aligned byte range of an uncompressed JSONL
file (whose first line number the partition recorded), or some row groups of a Parquet file. Every
record of a piece ends up either in a batch of documents or as a reject naming its file, line (or row)
and reason; with `on_invalid="fail"` the first bad record stops the read with that message instead.
Each record is checked: text present and a string within the size limits, id present and not one a document before
it in the shard has (record by record, a batch at a time with a pandera schema; on the fast paths, on the columns).
"""

from __future__ import annotations

import bz2
import collections
import gzip
import heapq
import io
import itertools
import lzma
import mmap
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, BinaryIO, Literal, TypeVar

import fsspec
import numpy as np
import orjson
import pyarrow
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq
import zstandard
from fsspec.compression import compr
from fsspec.implementations.local import LocalFileSystem
from isal import igzip, isal_zlib

from tokenmill.io.arrays import ARRAY_PROBE, ArrayStream, JSONArrayError, may_hold_array, opens_array, starts_array
from tokenmill.io.buffers import scan_parts
from tokenmill.io.direct import DIRECT_ALIGN, in_page_cache, mapped, open_direct, read_direct
from tokenmill.io.names import compression_of, format_of, local_path, name_under
from tokenmill.io.storage import options_for, read_object

if TYPE_CHECKING:  # imported where used: only the careful path needs them (0.4 s of every worker's start)
    import pandas as pd
    import pandera.pandas as pa

    from tokenmill.tokenizers.chat import ChatReading, RenderedChat
    from tokenmill.tokenizers.preference import PairReading, PairTexts


class Bz2Error(ValueError):
    """A corrupt bz2 stream (bz2 raises a bare OSError, as a disk's fault would be)."""


# What reading a truncated or corrupt compressed file raises: a stream that ended early (EOFError), data that is not
# gzip's (gzip.BadGzipFile, ISA-L's error for deflate data), a zstd frame, xz or bz2 data that does not decode; and a
# JSON array file malformed between its records or cut short.
CORRUPT_STREAM = (
    EOFError,
    gzip.BadGzipFile,
    isal_zlib.error,
    zstandard.ZstdError,
    lzma.LZMAError,
    Bz2Error,
    JSONArrayError,
)
BATCH_BYTES = 8 << 20  # text per batch handed to the encoder: bounds memory, not documents
READ_BUFFER = 1 << 20
ZSTD_CHUNK = 64 << 10  # compressed bytes decompressed at once: a chunk of repetitive text can grow a thousandfold
SAMPLE_BLOCK_BYTES = 64 << 10  # a sample's run of neighbouring documents (`sampled_blocks`): ~40 Wikipedia articles
SPARSE_BLOCKS = 64  # sampled blocks this many apart (4 MB) or more are read each alone, not with what lies between
LONG_LINE = 1 << 20  # a line that ends a directly read block may run this far past it (longer: it is mapped)
T, R = TypeVar("T"), TypeVar("R")
FILES_AHEAD = 16  # an object store's requests made at once (`_in_order`): small files read whole, their sizes
PANDERA_IMPORT = threading.Lock()
PANDERA_LOADED = threading.Event()


def schema_library():
    """`pandera.pandas`, imported and its first validation made (which imports its pandas backends, with its data
    strategies and hypothesis where installed: 0.8 s), under a lock: its modules import each other, so two threads
    importing them at once can deadlock (Python raises `_DeadlockError` in one) or one can see a module half made.
    Not in a process whose other threads may be running Prefect: importing `pandera.typing.common` replaces
    `typing._GenericAlias.__call__` (every `Generic[...](...)`) with a function that names a class defined a few
    lines later, and Prefect makes each task's engine so (`SyncTaskRunEngine[P, R](...)`): a task started in that
    moment failed the run with `NameError: name 'DataFrameBase' is not defined` (twice in `make test`, from a
    flow that imported it in a thread). The flow checks its stats table on a worker (`validate.stats_problems`)."""
    with PANDERA_IMPORT:
        import pandas as pd
        import pandera.pandas as pa

        if not PANDERA_LOADED.is_set():
            pa.DataFrameSchema({"n": pa.Column(int)}).validate(pd.DataFrame({"n": [0]}))
            PANDERA_LOADED.set()
        return pa


LINE_PROBE = 64 << 10  # read at a cut until its line ends
Buffer = bytes | memoryview
OnInvalid = Literal["fail", "quarantine"]


MISSING = "missing or null"  # how a reject says a record lacks a field (`stats.all_rejected` looks for it)
DUPLICATE = "duplicate id in this shard"


def text_missing(options: ReadOptions) -> str:
    return f"text field {options.text_field!r} {MISSING}"


def not_a_string(options: ReadOptions) -> str:
    return f"text field {options.text_field!r} not a string"


def id_missing(options: ReadOptions) -> str:
    return f"id field {options.id_field!r} {MISSING}"


def length_outside(options: ReadOptions) -> str:
    limit = f"at most {options.max_chars:,}" if options.max_chars is not None else "no upper limit"
    return f"text length outside [{options.min_chars}, {limit}] characters"


def few(names: Sequence[str], most: int = 12) -> str:
    """Names for a message: the first `most`, then "..." for the rest."""
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


@dataclass
class Piece:
    path: str
    # A byte offset in the uncompressed stream (always 0 for compressed files); of a piece of one group of rows of a
    # table file, a row in the group
    start: int = 0
    end: int | None = None  # exclusive; None: to the end of the file (of the group)
    # None: not counted (see partition.counts_lines): its lines are numbered from 1 at `start` until its file's
    # earlier pieces have been read
    first_line: int | None = 1
    # A file of tables: which of its groups of rows (Parquet's row groups, an Arrow file's record batches); None: all
    row_groups: list[int] | None = None
    format: str | None = None  # overrides the configured format (the shuffle's own files are "shuffled")
    # A small file's stored bytes, as the listing gave them (a run of small files: `_contents` reads one of an object
    # store with one request, not its size first); not part of what a shard is made of (its file's fingerprint is)
    size: int | None = field(default=None, compare=False)

    @property
    def whole(self) -> bool:
        """Whether it is its file whole."""
        return self.start == 0 and self.end is None and self.row_groups is None

    def to_json(self) -> dict:
        """Its fields, as plan.json holds them (`dataclasses.asdict` copies deeply: seconds for 100,000 files)."""
        return dict(vars(self))


@dataclass
class ReadOptions:
    """How records become documents (from the `input` config section)."""

    text_field: str = "text"
    id_field: str | None = None
    format: str = "auto"  # jsonl | parquet | arrow | text, or auto: from the file name
    on_invalid: OnInvalid = "quarantine"
    min_chars: int = 1
    max_chars: int | None = None
    separator: str | None = None  # plain text: a line that separates documents; None: one document per file
    fields: tuple[str, ...] = ()  # extra fields to carry along (e.g. for stratified sampling)
    storage_options: dict = field(default_factory=dict)
    conversations: bool = False  # records are conversations (input.chat) or pairs (input.preference): read whole
    chat: ChatReading | None = None  # conversations' template; needed to read them
    pairs: PairReading | None = None  # preference pairs' fields and template; needed to read them
    root: str | None = None  # where the source's files lie (`names.input_root`): their names are paths under it

    def name_of(self, url: str) -> str:
        """The file's name in document ids and messages: its path under the source's root."""
        return name_under(self.root, url)


class LineIds(Sequence[str]):
    """The ids `<file>:<line>` of a block's documents, by their `lines`, made only when asked for: a run into one
    split hashes none of them. `name` is the file's, or each document's (joined small files', `_join`)."""

    def __init__(self, name: str | pyarrow.Array, lines: np.ndarray):
        self.name, self.lines = name, lines

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, index):
        return self.as_list()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_list())

    def as_list(self) -> list[str]:
        if isinstance(self.name, str):
            return [f"{self.name}:{n}" for n in self.lines.tolist()]
        return [f"{name}:{n}" for name, n in zip(self.name.to_pylist(), self.lines.tolist(), strict=True)]


@dataclass
class Batch:
    ids: Sequence[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    extra: dict[str, list] = field(default_factory=dict)
    nbytes: int = 0
    text_array: pyarrow.Array | None = None  # the columnar fast path's texts (then `texts` stays empty)
    chats: list[RenderedChat] | None = None  # conversations: each rendered, with its spans that carry loss (`texts`)
    pairs: list[PairTexts] | None = None  # preference pairs: each one's texts (`texts`: its longest)
    lines: int = 0  # the fast path's: the lines of the file its block spans, blank and rejected ones included
    # the fast path's: its block, as a piece of its file (read alone, it gives this batch's records again; a table
    # file's group of rows gives those of each of its batches), or the pieces of a run of whole small files read as
    # one batch (`_fast_files`, `_joined`)
    block: Piece | list[Piece] | None = None
    # Where each document came from, for its row of the documents table (`formats.provenance`): its input file
    # (the path as the plan lists it), and its line there (JSONL, text; from 1) or row (Parquet; from 1)
    doc_files: list[str] = field(default_factory=list)
    doc_lines: list[int] | np.ndarray = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def text_values(self) -> pyarrow.Array | list[str]:
        """The texts as the fast path read them (a pyarrow string array), else the list."""
        return self.text_array if self.text_array is not None else self.texts

    def add(self, raw: Record, doc_id: str, text: str, fields: Sequence[str]) -> None:
        """A record that passed its checks, as the careful path takes it: its id, text, origin and extra fields."""
        self.ids.append(doc_id)
        self.texts.append(text)
        self.doc_files.append(raw.path)
        self.doc_lines.append(raw.line)
        for f in fields:
            self.extra[f].append(raw.extra.get(f))
        self.nbytes += raw.size


@dataclass
class Reject:
    file: str
    line: int  # line number (JSONL, text) or row number (Parquet), from 1; 0: the file as a whole
    reason: str
    record: str  # the raw record, cut to a readable length
    from_byte: int | None = None  # set where `line` counts from this offset of the file, not from its start

    def to_dict(self) -> dict:
        where = {} if self.from_byte is None else {"from_byte": self.from_byte}
        return {"file": self.file, "line": self.line, **where, "reason": self.reason, "record": self.record}


class InputError(Exception):
    """Input that cannot be read at all (missing, truncated, undecodable), or a bad record under `fail`."""


@dataclass
class Record:
    """One record as read, before validation: its position, values (None when absent) and raw form."""

    line: int
    doc_id: object
    text: object
    extra: dict
    raw: bytes
    problem: str | None = None  # set when the record could not even be parsed
    file: str = ""  # the input file it came from (set by `records`)
    size: int = -1  # bytes as read; -1: len(raw)
    path: str = ""  # that file's path as the plan lists it (set by `records`)

    def __post_init__(self):
        if self.size < 0:
            self.size = len(self.raw)

    def to_json(self) -> bytes:
        """The record as one JSONL line, for the shuffle to carry it unvalidated to another shard
        (the raw form only where it could not be parsed: otherwise id and text say it all)."""
        raw = _shorten(self.raw) if self.problem else ""
        fields = (self.file, self.line, self.doc_id, self.text, self.extra, raw, self.problem, self.size, self.path)
        return orjson.dumps(dict(zip(SHUFFLED_FIELDS, fields, strict=True)), default=str) + b"\n"


SHUFFLED_FIELDS = ("file", "line", "id", "text", "extra", "raw", "problem", "size", "path")


def field_value(record, dotted: str):
    """The value at a dotted path in a parsed record (`meta.text`), or None where it is absent."""
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


@contextmanager
def open_piece(piece: Piece, options: ReadOptions, block_size: int | None = None) -> Iterator[BinaryIO]:
    """The piece's file as a binary stream, decompressed (positions are uncompressed offsets); a file of one JSON
    array as the JSON Lines of its records (`arrays`). `block_size`: what an object store's file reads at a time
    (None: its default, s3fs's 50 MB, which it reads ahead of a read)."""
    with _decompressed(piece, options, block_size) as f:
        # A piece from a record of an array: its file's start looked at alone (not a block of an object store's)
        if not (_may_hold_array(piece, options) and (holds_array(piece, options) if piece.start else opens_array(f))):
            yield f
            return
        if _skip_to(f, 0, piece.start) < piece.start:
            raise JSONArrayError(f"the file ends before byte {piece.start}, where this piece of it starts")
        stream = ArrayStream(f, piece.start, piece.end, piece.first_line or 1)
        yield io.BufferedReader(stream, READ_BUFFER)
        if stream.error:  # the reader has read every record before it
            raise stream.error


@contextmanager
def _decompressed(piece: Piece, options: ReadOptions, block_size: int | None = None) -> Iterator[BinaryIO]:
    fs, path = fsspec.core.url_to_fs(piece.path, **options_for(piece.path, options.storage_options))
    codec = compression_of(piece.path)
    with fs.open(path, "rb", block_size=block_size) as raw:
        if codec is None:
            yield raw
            return
        if codec in ("zstd", "bz2"):
            yield io.BufferedReader(ZstdFrames(raw) if codec == "zstd" else Bz2Stream(raw), READ_BUFFER)
            return
        # gzip by ISA-L: 4x zlib's speed here (zlib's 220 MB/s a core was as slow as the encoder), the same stream
        with igzip.IGzipFile(fileobj=raw, mode="rb") if codec == "gzip" else compr[codec](raw, mode="r") as f:
            yield f


class ZstdFrames(io.RawIOBase):
    """A zstd file's frames, decompressed, a chunk at a time. A file that ends inside a frame (a download cut
    short) raises EOFError, as a cut gzip file does: zstandard's stream reader ends there as if the file did."""

    def __init__(self, raw: BinaryIO):
        self.raw, self.decompressor = raw, zstandard.ZstdDecompressor()
        self.frame, self.out, self.position, self.started = self.decompressor.decompressobj(), b"", 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.position == len(self.out):
            chunk = self.raw.read(ZSTD_CHUNK)
            if not chunk:
                if self.started and not self.frame.eof:
                    raise EOFError("the file ends inside a zstd frame: cut short")
                return 0
            self.started = True
            self.out, self.position = b"", 0
            while chunk:
                if self.frame.eof:  # the next frame (pzstd and zstd -T write several)
                    self.frame = self.decompressor.decompressobj()
                self.out += self.frame.decompress(chunk)
                chunk = self.frame.unused_data if self.frame.eof else b""
        n = min(len(buffer), len(self.out) - self.position)
        buffer[:n] = self.out[self.position : self.position + n]
        self.position += n
        return n


class Bz2Stream(io.RawIOBase):
    """A bz2 file, decompressed; corrupt data raises Bz2Error, not the bare OSError bz2 raises."""

    def __init__(self, raw: BinaryIO):
        self.file = bz2.BZ2File(raw)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:  # what one read decompresses: a read filling the buffer would lose it to an error further on
            data = self.file.read1(len(buffer))
        except OSError as e:
            if e.errno is not None:  # the file's own read failed
                raise
            raise Bz2Error(str(e)) from None
        buffer[: len(data)] = data
        return len(data)


def _may_hold_array(piece: Piece, options: ReadOptions) -> bool:
    """A JSON file whose name allows an array (`arrays.may_hold_array`)."""
    return kind_of(piece, options) == "jsonl" and may_hold_array(piece.path)


def holds_array(piece: Piece, options: ReadOptions) -> bool:
    """Whether the piece is of a file of one JSON array: a look at the file's first bytes, those alone (not an object
    store's read-ahead: the read that follows would download them again). Such a piece (cut by the partition at
    records, or a block read again) starts at a record (`arrays.ArrayStream`)."""
    if not _may_hold_array(piece, options):
        return False
    with _decompressed(Piece(piece.path), options, ARRAY_PROBE) as f:
        return opens_array(f)


def _jsonl_records(piece: Piece, options: ReadOptions, name: str) -> Iterator[Record]:
    with open_piece(piece, options) as f:
        pos, number = first_line_at(f, piece.start), piece.first_line or 1
        if pos is None:
            return
        for line in f:
            if piece.end is not None and pos >= piece.end:
                break
            pos += len(line)
            line = line.rstrip(b"\r\n")
            if line.strip():  # blank lines separate nothing in JSONL; they are not records
                yield _parse_json_line(number, line, options, name)
            number += 1


# A line that opens a JSON array in a file named for lines: most likely one array of records (Alpaca's datasets)
ARRAY_HINT = "a file of one JSON array is read as such where its name ends in .json, not .jsonl"


def _parse_json_line(number: int, line: bytes, options: ReadOptions, name: str) -> Record:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        # What the fast path's parser takes, a line takes here too: NaN and Infinity, nesting past orjson's 1,024
        # levels. Otherwise a record's fate would depend on whether its block went the careful way.
        record = _arrow_record(line, options)
        if record is None:
            try:
                line.decode("utf-8")
                opens = line.lstrip().startswith(b"[") and not may_hold_array(name)
                problem = f"malformed JSON: {e}" + (f" ({ARRAY_HINT})" if opens else "")
            except UnicodeDecodeError as u:
                problem = f"invalid UTF-8 at byte {u.start}"
            return Record(number, None, None, {}, line, problem)
    if not isinstance(record, dict):
        hint = f"; {ARRAY_HINT}" if isinstance(record, list) and not may_hold_array(name) else ""
        return Record(number, None, None, {}, line, f"not a JSON object ({type(record).__name__}{hint})")
    doc_id = f"{name}:{number}" if options.id_field is None else field_value(record, options.id_field)
    extra = {f: field_value(record, f) for f in options.fields}
    text = record if options.conversations else field_value(record, options.text_field)
    return Record(number, doc_id, text, extra, line)


def _table_file_records(piece: Piece, options: ReadOptions, name: str) -> Iterator[Record]:
    """A Parquet or Arrow file's rows (`TABLES`)."""
    for _, first, table in TABLES[kind_of(piece, options)](piece, options, name, BATCH_BYTES):
        yield from _table_records(table, first, options, name)


def _parquet_tables(
    piece: Piece, options: ReadOptions, name: str, batch_bytes: int
) -> Iterator[tuple[int, int, pyarrow.Table]]:
    """(its row group, the number of its first row, from 1; a table of the columns the records need) for the piece's
    row groups (its rows of one), a batch of about `batch_bytes` (uncompressed, as the footer counts them) at a time:
    memory holds a batch decoded and its row group's columns compressed, not the row group decoded (a Hugging Face
    file's can be hundreds of MB). The pages before a piece's first row are decoded and passed over."""
    with fsspec.open(piece.path, "rb", **options_for(piece.path, options.storage_options)) as f:
        parquet = pq.ParquetFile(f)
        groups = piece.row_groups if piece.row_groups is not None else list(range(parquet.num_row_groups))
        top = _columns(parquet.schema_arrow.names, options, name, "Parquet")
        starts = [0]
        for g in range(parquet.num_row_groups):
            starts.append(starts[-1] + parquet.metadata.row_group(g).num_rows)
        for g in groups:
            group = parquet.metadata.row_group(g)
            rows = max(1, batch_bytes * group.num_rows // max(1, group.total_byte_size))
            batches = parquet.iter_batches(batch_size=rows, row_groups=[g], columns=top)
            for row, batch in _rows_of(piece, batches):
                yield g, starts[g] + row + 1, pyarrow.Table.from_batches([batch])


def _rows_of(piece: Piece, batches: Iterator[pyarrow.RecordBatch]) -> Iterator[tuple[int, pyarrow.RecordBatch]]:
    """(the number of its first row in the group, from 0; the rows) of a group's `batches` that the piece reads: all,
    or its rows [start, end) of the group."""
    at = 0  # the group's row the batch starts at
    for batch in batches:
        lo, hi = max(piece.start, at), at + batch.num_rows if piece.end is None else min(piece.end, at + batch.num_rows)
        if lo < hi:
            yield lo, batch.slice(lo - at, hi - lo)
        at += batch.num_rows
        if piece.end is not None and at >= piece.end:
            return


@contextmanager
def _arrow_batches(
    piece: Piece, options: ReadOptions, sizes: bool = False
) -> Iterator[tuple[pyarrow.Schema, Iterator[pyarrow.RecordBatch], list[tuple[int, int]] | None]]:
    """An Arrow IPC file's schema and its record batches in turn: a stream (as Hugging Face datasets writes one:
    `save_to_disk`, its cache) or the file format (Feather 2). A local file is mapped, as `datasets` maps it: a batch
    passed over (skipped, measured) is not read. With `sizes`, a local file's batches' rows and bytes, passed over;
    None for a file elsewhere, or one that cannot be read through (cut short, damaged)."""
    fs, path = fsspec.core.url_to_fs(piece.path, **options_for(piece.path, options.storage_options))
    local = isinstance(fs, LocalFileSystem)
    with pyarrow.memory_map(path) if local else fs.open(path, "rb") as f:
        measured = None
        if sizes and local:
            with suppress(pyarrow.ArrowInvalid, OSError):  # not Arrow, cut short, damaged: said where it is read
                measured = [(batch.num_rows, batch.get_total_buffer_size()) for batch in _ipc_batches(f)[1]]
            f.seek(0)
        schema, batches = _ipc_batches(f)
        yield schema, batches, measured


def _ipc_batches(f) -> tuple[pyarrow.Schema, Iterator[pyarrow.RecordBatch]]:
    """The schema and the record batches of the Arrow IPC stream, or file (Feather 2), that `f` holds."""
    try:
        stream = pyarrow.ipc.open_stream(f)
        return stream.schema, iter(stream)
    except pyarrow.ArrowInvalid:  # the file format: its batches by number
        f.seek(0)
        reader = pyarrow.ipc.open_file(f)
        return reader.schema, (reader.get_batch(k) for k in range(reader.num_record_batches))


def _arrow_tables(
    piece: Piece, options: ReadOptions, name: str, batch_bytes: int
) -> Iterator[tuple[int, int, pyarrow.Table]]:
    """`_parquet_tables` for an Arrow IPC file (`_arrow_batches`): its record batches are its groups of rows, each
    read in turn (those the piece names), in tables of about `batch_bytes`."""
    wanted = None if piece.row_groups is None else set(piece.row_groups)
    last = None if wanted is None else max(wanted, default=-1)
    with _arrow_batches(piece, options) as (schema, batches, _):
        top, first = _columns(schema.names, options, name, "Arrow"), 1  # the batch's first row
        for k, batch in enumerate(batches):
            if wanted is None or k in wanted:
                rows = max(1, batch_bytes * batch.num_rows // max(1, batch.nbytes))
                parts = (batch.slice(start, rows) for start in range(0, batch.num_rows, rows))
                for row, part in _rows_of(piece, parts):
                    yield k, first + row, pyarrow.Table.from_batches([part.select(top)])
            elif k > last:
                return
            first += batch.num_rows


def groups_of(piece: Piece, options: ReadOptions) -> list[tuple[int, int]] | None:
    """(rows, bytes uncompressed) of each group of rows of a Parquet or Arrow piece's file, which `Piece.row_groups`
    names by their number: a Parquet footer's, an Arrow file's measured where it is local (`_arrow_batches`), else
    None (they are not known without reading the file)."""
    if kind_of(piece, options) == "parquet":
        with fsspec.open(piece.path, "rb", **options_for(piece.path, options.storage_options)) as f:
            meta = pq.ParquetFile(f).metadata
        return [(meta.row_group(g).num_rows, meta.row_group(g).total_byte_size) for g in range(meta.num_row_groups)]
    with _arrow_batches(piece, options, sizes=True) as (_, _, sizes):
        return sizes


def piece_groups(piece: Piece, options: ReadOptions) -> tuple[Sequence[int], int] | None:
    """The numbers of a Parquet or Arrow piece's groups of rows (all of its file's where it names none) and how many
    its file has; None where they are not known without reading the file (`groups_of`)."""
    if (groups := groups_of(piece, options)) is None:
        return None
    return (piece.row_groups if piece.row_groups is not None else range(len(groups))), len(groups)


def block_place(block: Piece | list[Piece]) -> tuple[int, int]:
    """Where a batch's block (`Batch.block`) lies in its file, as the tokenize stage records it: its bytes, or
    [g, g + 1) for a table file's group of rows g, the piece's rows of it; for a run of n whole files, (-n, 0) from
    its first (no offset is negative: `block_pieces` reads each again)."""
    if isinstance(block, list):
        return -len(block), 0
    return (block.row_groups[0], block.row_groups[0] + 1) if block.row_groups else (block.start, block.end)


def block_pieces(
    pieces: Sequence[Piece], index: int, start: int, stop: int, first_line: int, options: ReadOptions
) -> list[Piece]:
    """The block at `block_place`'s (start, stop) of the shard's piece `index`, as pieces to read again alone."""
    piece = pieces[index]
    if start < 0:  # a run of whole files, from this one
        return list(pieces[index : index - start])
    if kind_of(piece, options) in TABLES:
        return [Piece(piece.path, piece.start, piece.end, first_line, row_groups=[start])]
    return [Piece(piece.path, start, stop, first_line)]


def _columns(names: list[str], options: ReadOptions, name: str, kind: str) -> list[str]:
    """The columns the records need, of a table file's `names`; an InputError where one is missing."""
    top = {field.split(".")[0] for field in (options.text_field, options.id_field, *options.fields) if field}
    if options.conversations:  # a conversation's fields are the record's (input.chat names them)
        top = set(names)
    if missing := top - set(names):
        column = sorted(missing)[0]
        setting = {options.text_field.split(".")[0]: "input.text_field"}
        if options.id_field:
            setting[options.id_field.split(".")[0]] = "input.id_field"
        fix = f": set {setting[column]} to the column that holds it" if column in setting else ""
        raise InputError(f"{name}: no column {column!r} in the {kind} schema (its columns: {few(names)}){fix}")
    return sorted(top)


TABLES = {"parquet": _parquet_tables, "arrow": _arrow_tables}  # files of tables: their rows are the records


def _table_records(table: pyarrow.Table, first: int, options: ReadOptions, name: str) -> Iterator[Record]:
    """A table's rows as records, numbered from `first`."""
    for number, record in enumerate(table.to_pylist(), start=first):
        doc_id = f"{name}:{number}" if options.id_field is None else field_value(record, options.id_field)
        extra = {f: field_value(record, f) for f in options.fields}
        text = record if options.conversations else field_value(record, options.text_field)
        yield Record(number, doc_id, text, extra, orjson.dumps(record, default=str))


def _text_records(piece: Piece, options: ReadOptions, name: str) -> Iterator[Record]:
    """A plain text file: one document, or the documents between lines equal to `input.separator`, read a chunk at a
    time (memory holds a document, not the file: TinyStories' .txt is 2 GB). Each document is numbered by its first
    line; one that is not UTF-8 is a reject (the whole file's, line 0, when it is one document). A piece of a file
    cut by the partition starts just after a separator line and ends just after one (`separated_start`)."""
    with open_piece(piece, options) as f:
        if options.separator is None:
            yield _text_record(f.read(), name, 1, reject_at=0)
            return
        _skip_to(f, 0, piece.start)
        left = None if piece.end is None else piece.end - piece.start
        for first, data, _, _ in _separated(f, options.separator.encode(), piece.first_line or 1, left):
            if record := _text_document(first, data, name):
                yield record


def _separated(f: BinaryIO, separator: bytes, first: int, left: int | None) -> Iterator[tuple[int, bytes, int, int]]:
    """(first line, bytes, end, next line) of each document of the stream (its next `left` bytes, or all): the text
    between separator lines (`_separator_line`), less the line break before a separator; where it ends (the bytes of
    the stream through its separator line) and the line after that."""
    buffer, searched, start = bytearray(b"\n"), 0, 0  # buffer[0]: the newline before the document at `start`
    while True:
        chunk = f.read(READ_BUFFER if left is None else min(READ_BUFFER, left))
        if left is not None:
            left -= len(chunk)
        buffer += chunk
        while found := _separator_line(buffer, separator, searched):
            line_break, end = found
            after = first + buffer.count(b"\n", 1, line_break + 1) + 1  # the document's lines and the separator's
            start += end - 1
            yield first, _before(buffer, line_break), start, after
            del buffer[: end - 1]
            first, searched = after, 0
        if not chunk:
            break
        searched = max(len(buffer) - len(separator) - 3, 0)  # a separator line whose end is not read yet
    rest = buffer[1:]
    after = first + rest.count(b"\n") + (rest[-1:] not in (b"", b"\n"))
    # The stream's last line may be a separator line without its newline
    ending = next((end for end in (b"\n" + separator, b"\n" + separator + b"\r") if buffer.endswith(end)), None)
    document = bytes(rest) if ending is None else _before(buffer, len(buffer) - len(ending))
    yield first, document, start + len(rest), after


def _before(buffer: bytearray, line_break: int) -> bytes:
    """The document from buffer[1] to the line break (`\\n` or `\\r\\n`) whose newline is at `line_break`."""
    return bytes(buffer[1 : line_break - (buffer[line_break - 1 : line_break] == b"\r")])


def _separator_line(buffer: bytearray, separator: bytes, at: int) -> tuple[int, int] | None:
    """The first line of `buffer` equal to `separator` once its line ending (`\\n` or `\\r\\n`) is taken off, that
    starts after a newline at or after `at`: (that newline's place, the end of the line's ending); None where there is
    none whose ending is read."""
    head = b"\n" + separator
    while (found := buffer.find(head, at)) >= 0:
        end = found + len(head)
        for ending in (b"\n", b"\r\n"):
            if buffer[end : end + len(ending)] == ending:
                return found, end + len(ending)
        at = found + 1
    return None


def separated_start(f: BinaryIO, target: int, separator: bytes) -> int:
    """Where a document of a text file split by `separator` lines starts after `target` (> 0): just past the first
    separator line (`_separator_line`, as `_text_records` reads them) that starts after the line `target` is in, or
    at the file's end."""
    start = line_start(f, target) - 1  # the newline that ends the line before
    f.seek(start)
    buffer = bytearray()  # the file from `start`
    while chunk := f.read(LINE_PROBE):
        buffer += chunk
        if found := _separator_line(buffer, separator, 0):
            return start + found[1]
        dropped = max(len(buffer) - len(separator) - 3, 0)  # keep what a separator line cut by the read may start
        start += dropped
        del buffer[:dropped]
    return start + len(buffer)


def _text_document(first: int, data: bytes, name: str) -> Record | None:
    """A document of a text file split by a separator, from line `first`; None where it is blank (no document)."""
    record = _text_record(data, f"{name}:{first}", first, reject_at=first)
    return record if record.problem or record.text.strip() else None


def one_document(piece: Piece, options: ReadOptions) -> bool:
    """Whether the piece is a text file that is one document (no `input.separator`)."""
    return kind_of(piece, options) == "text" and options.separator is None and not options.conversations


def separated_text(piece: Piece, options: ReadOptions) -> bool:
    """Whether the piece is of a text file split by `input.separator` lines (cut, sampled and read in blocks)."""
    return kind_of(piece, options) == "text" and options.separator is not None and not options.conversations


def _text_record(data: bytes, doc_id: str, line: int, reject_at: int) -> Record:
    try:
        return Record(line, doc_id, data.decode("utf-8"), {}, data)
    except UnicodeDecodeError as e:
        return Record(reject_at, None, None, {}, data[:2000], f"invalid UTF-8 at byte {e.start}")


def _shuffled_records(piece: Piece, options: ReadOptions, name: str) -> Iterator[Record]:
    """Records as the global shuffle wrote them, each still naming its original file and line."""
    with open_piece(piece, options) as f:
        for line in f:
            yield _shuffled_record(line)


def _shuffled_record(line: bytes) -> Record:
    r = orjson.loads(line)
    raw = r["raw"].encode() if r["problem"] else orjson.dumps({"id": r["id"], "text": r["text"]}, default=str)
    path = r.get("path") or r["file"]  # a scatter of an earlier tokenmill carried the file's name only
    return Record(r["line"], r["id"], r["text"], r["extra"], raw, r["problem"], r["file"], r["size"], path)


READERS = {
    "jsonl": _jsonl_records,
    "parquet": _table_file_records,
    "arrow": _table_file_records,
    "text": _text_records,
    "shuffled": _shuffled_records,
}
LINE_KINDS = ("jsonl", "shuffled")  # one record per line: a block of whole lines can be read on its own


def kind_of(piece: Piece, options: ReadOptions) -> str:
    """The piece's reader: `jsonl`, `parquet`, `text` or `shuffled`."""
    return piece.format or (format_of(piece.path) if options.format == "auto" else options.format)


def _skip_to(f: BinaryIO, position: int, target: int) -> int:
    """Move forward to `target` (reading and dropping where the stream cannot seek, as a zstd stream; a gzip stream
    seeks so, decompressing); return the position."""
    if f.seekable():
        f.seek(target)
        return target
    while position < target and (data := f.read(min(target - position, 1 << 20))):
        position += len(data)
    return position


def first_line_at(f: BinaryIO, start: int) -> int | None:
    """Move the stream `f` (at its start) to the first line that starts at or after `start`, and return where that is:
    a piece holds the lines that start in it. `line_start`'s rule, for a stream read on from there (a gzip stream seeks
    back by decompressing from its start again). A compressed file is cut where the partition cannot see its lines.
    None where a compressed stream breaks (cut short, damaged) before: no line starts in the piece, and the piece the
    break is in says so (a reject naming the file); the pieces after it would each have said it again."""
    if start == 0:
        return 0
    try:
        position = _skip_to(f, 0, start - 1)
        return position + len(f.readline())
    except CORRUPT_STREAM:
        return None


def whole_file_sizes(pieces: Sequence[Piece], options: ReadOptions) -> dict[str, int]:
    """The sizes of the pieces that are whole files of lines, neither compressed nor perhaps arrays, by path, the
    files not opened: a local file's looked up, an object store's as the plan's listing gave it (`Piece.size`), else
    asked for FILES_AHEAD at a time (opening a file asks for its size, a request each, one after another). Those it
    cannot tell are left out."""
    whole = [
        piece
        for piece in pieces
        if piece.whole and kind_of(piece, options) in LINE_KINDS
        and not compression_of(piece.path) and not may_hold_array(piece.path)
    ]  # fmt: skip

    def size(piece: Piece) -> int | None:
        with suppress(Exception):  # the reader says what is wrong with it
            if (local := local_path(piece.path)) is not None:
                return os.stat(local).st_size
            if piece.size is not None:
                return piece.size
            fs, inner = fsspec.core.url_to_fs(piece.path, **options_for(piece.path, options.storage_options))
            return int(fs.size(inner))
        return None

    sizes = _in_order(size, whole, not whole or local_path(whole[0].path) is not None)
    return {piece.path: nbytes for piece, nbytes in sizes if nbytes is not None}


def sampled_blocks(piece: Piece, options: ReadOptions, every: int, phase: int) -> Iterator[tuple[int, bytes]]:
    """(block number, its whole lines) for the blocks b = phase (mod every) of the piece's file that start in the
    piece: the lines starting at offsets [b * SAMPLE_BLOCK_BYTES, (b + 1) * SAMPLE_BLOCK_BYTES), the last one read to
    its end. The same lines whatever the piece's bounds, so the sample does not depend on the shards."""
    first = -(-piece.start // SAMPLE_BLOCK_BYTES)  # the first block starting in the piece
    b = first + (phase - first) % every
    # Blocks far apart are each a read of their own: an object store's file reads a block (s3fs: 50 MB) ahead
    sparse = every >= SPARSE_BLOCKS and compression_of(piece.path) is None
    with open_piece(piece, options, 2 * SAMPLE_BLOCK_BYTES if sparse else None) as f:
        position = 0
        while piece.end is None or b * SAMPLE_BLOCK_BYTES < piece.end:
            lo, hi = b * SAMPLE_BLOCK_BYTES, (b + 1) * SAMPLE_BLOCK_BYTES
            if position < lo:  # the first line start at or after lo follows the first newline at or after lo - 1
                position = _skip_to(f, position, max(lo - 1, 0))
                head = f.read(hi - position)
                position += len(head)
                if not head:
                    return
                cut = head.find(b"\n") + 1 if lo else 0
                lines = head[cut:] if cut or not lo else b""
            else:  # a line of an earlier block ended at or after lo: `position` is a line start
                lines = f.read(hi - position) if position < hi else b""
                position += len(lines)
            if lines and not lines.endswith(b"\n"):
                tail = f.readline()
                lines, position = lines + tail, position + len(tail)
            if lines:
                yield b, lines
            b += every


def sampled_texts(piece: Piece, options: ReadOptions, every: int, phase: int) -> Iterator[tuple[int, Batch, int]]:
    """`sampled_blocks` for an uncompressed text file split by a separator: (block number, its documents, ids
    `<file>#<block>:<line in the block>`, the bytes read) for the blocks b = phase (mod every) that start in the
    piece. Block b holds the documents from S(b) to S(b + 1), where S(b) is the first document start after the line
    that offset b * SAMPLE_BLOCK_BYTES is in (`separated_start`, as the partition cuts; S(0) = 0): the same documents
    whatever the piece's bounds. Each block is a read of its own, found by seeking."""
    name, separator = options.name_of(piece.path), options.separator.encode()
    with open_piece(piece, options, 2 * SAMPLE_BLOCK_BYTES if every >= SPARSE_BLOCKS else None) as f:
        size = f.seek(0, os.SEEK_END)
        starts = {0: 0}

        def start(b: int) -> int:
            if b not in starts:
                starts[b] = min(separated_start(f, b * SAMPLE_BLOCK_BYTES, separator), size)
            return starts[b]

        end, first = size if piece.end is None else piece.end, -(-piece.start // SAMPLE_BLOCK_BYTES)
        # S(first - 1) is at most the piece's start (a document start): the block is the piece's if it is there
        blocks = [first - 1] if first and (first - 1) % every == phase and start(first - 1) == piece.start else []
        blocks += range(first + (phase - first) % every, -(-end // SAMPLE_BLOCK_BYTES), every)
        for b in blocks:
            lo, hi = start(b), start(b + 1)
            if lo >= end or hi <= lo:  # the next piece's, or no document starts in it
                continue
            f.seek(lo)
            documents = [(line, data) for line, data, _, _ in _separated(f, separator, 1, hi - lo)]
            batch, _ = _text_batch(documents, f"{name}#{b}", piece.path, options, set(), own_name=True)
            yield b, batch, hi - lo


def read_lines(
    block: bytes, first_line: int, name: str, kind: str, options: ReadOptions, seen_ids: set[str]
) -> tuple[Batch, list[Reject]]:
    """The documents and rejects of a block of whole lines of a line-based input (`LINE_KINDS`) whose first
    is line `first_line` of file `name`."""
    if kind == "jsonl":
        return jsonl_block(block, first_line, name, options, seen_ids)
    return _checked([_shuffled_record(line) for line in block.split(b"\n") if line.strip()], options, seen_ids)


def records(piece: Piece, options: ReadOptions) -> Iterator[Record]:
    """The piece's records, with file-level failures turned into one clear message."""
    name = options.name_of(piece.path)
    count = 0
    try:
        for raw in READERS[kind_of(piece, options)](piece, options, name):
            count += 1
            raw.file, raw.path = raw.file or name, raw.path or piece.path
            yield raw
    except FileNotFoundError as e:
        raise InputError(f"{piece.path}: no such file") from e
    except InputError:
        raise
    except Exception as e:  # truncated gzip, corrupt zstd frame, unreadable Parquet: name the file, not the library
        yield _unreadable(name, count, e, options)
        return
    if count == 0 and piece.start == 0 and not piece.row_groups and piece.format != "shuffled":
        problem = "empty file: no records"
        if options.on_invalid == "fail":
            raise InputError(f"{name}: {problem}")
        yield Record(0, None, None, {}, b"", problem, name)


def _unreadable(name: str, count: int, error: Exception, options: ReadOptions) -> Record:
    """The record that stands for the rest of a file that cannot be read on after `count` records (under `fail`, the
    error that stops the read)."""
    problem = f"cannot be read after {count} records ({type(error).__name__}: {error})"
    if options.on_invalid == "fail":
        raise InputError(f"{name}: {problem}") from error
    return Record(0, None, None, {}, b"", problem, name)


def largest_records(pieces: list[Piece], options: ReadOptions, most: int = 3) -> list[tuple[str, int, int]]:
    """(file, line, bytes) of the `most` largest records of the pieces, largest first: what a message about a shard
    that ran out of memory names. One pass of the careful reader (it parses each record)."""
    return heapq.nlargest(
        most, ((r.file, r.line, r.size) for p in pieces for r in records(p, options)), key=lambda r: r[2]
    )


def record_schema(options: ReadOptions) -> pa.DataFrameSchema:
    """The checks of each record of a batch alone: its text present, a string within the size limits, its id present
    (whether the id is another document's, `_validate` tells after them)."""
    pa = schema_library()

    def is_string(values: pd.Series) -> pd.Series:
        return values.map(lambda v: v is None or isinstance(v, str)).astype(bool)

    def within_limits(values: pd.Series) -> pd.Series:
        lengths = values.map(lambda v: len(v) if isinstance(v, str) else 0)
        ok = lengths >= options.min_chars
        return ok & (lengths <= options.max_chars) if options.max_chars is not None else ok

    return pa.DataFrameSchema(
        {
            "text": pa.Column(
                checks=[
                    pa.Check(lambda t: t.notna(), error=text_missing(options), ignore_na=False),
                    pa.Check(is_string, error=not_a_string(options), ignore_na=False),
                    pa.Check(within_limits, error=length_outside(options), ignore_na=False),
                ],
                nullable=True,  # absence is reported by a check that names the field
            ),
            "doc_id": pa.Column(
                checks=[pa.Check(lambda ids: ids.notna(), error=id_missing(options), ignore_na=False)], nullable=True
            ),
        },
    )


def _validate(raws: list[Record], options: ReadOptions, seen_ids: set[str]) -> dict[int, str]:
    """Position in `raws` -> the reason it is not a valid document: the first of its own (`record_schema`, in the
    order `reasons` gives), else its id one that a document before it in the shard has. So a record's reason does
    not depend on where batches end, and the columnar path gives the same (`_row_problems`)."""
    import pandas as pd

    pa = schema_library()
    problems = {i: r.problem for i, r in enumerate(raws) if r.problem}
    frame = pd.DataFrame({"text": [r.text for r in raws], "doc_id": [r.doc_id for r in raws]}, dtype=object).drop(
        index=list(problems)
    )
    try:
        record_schema(options).validate(frame, lazy=True)
    except pa.errors.SchemaErrors as e:
        rank = {reason: k for k, reason in enumerate(reasons(options))}  # any other check pandera names: after them
        cases = e.failure_cases.dropna(subset=["index"])
        ranked = sorted(zip(cases["index"], cases["check"], strict=True), key=lambda c: rank.get(c[1], len(rank)))
        for index, check in ranked:
            problems.setdefault(int(index), check)
    _repeated_ids([str(raw.doc_id) for raw in raws], problems, seen_ids)
    return problems


def _repeated_ids(ids: Sequence[str], problems: dict[int, str], seen_ids: set[str]) -> None:
    """Mark in `problems` each id, of a record with none of its own, that a document before it in the shard has (an
    earlier batch's, `seen_ids`, or this one's): the first is the document, a rejected record takes no id."""
    taken: set[str] = set()  # the ids of the batch's documents so far
    for k, doc_id in enumerate(ids):
        if k not in problems:
            if doc_id in seen_ids or doc_id in taken:
                problems[k] = DUPLICATE
            taken.add(doc_id)


def reasons(options: ReadOptions) -> list[str]:
    """Why a record is not a document, of its own, the first that applies first."""
    return [text_missing(options), not_a_string(options), length_outside(options), id_missing(options)]


def _shorten(raw: bytes, limit: int = 2000) -> str:
    text = raw.decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[:limit] + "..."


def read_documents(
    pieces: list[Piece], options: ReadOptions, columnar: bool = False, batch_bytes: int = BATCH_BYTES
) -> Iterator[tuple[Batch, list[Reject]]]:
    """Yield (batch of valid documents, rejects among the same records), batches of about `batch_bytes`.
    With `columnar`, JSONL, Parquet, Arrow and text split by a separator are read by the fast paths (`_fast_jsonl`,
    `_fast_tables`, `_fast_text`) where they apply, small files' batches joined (`_joined`), and text files of one
    document a run of them at a time (`_fast_files`)."""
    seen_ids: set[str] = set()
    paths_named: dict[str, set[str]] = {}
    for piece in pieces:
        paths_named.setdefault(options.name_of(piece.path), set()).add(piece.path)
    for whole_files, run in itertools.groupby(pieces, lambda piece: _whole_files(piece, options) if columnar else None):
        if whole_files == "documents":  # a source tree's files: thousands of a few KB, read a run of them at a time
            yield from _fast_files(list(run), options, seen_ids, batch_bytes)
        elif whole_files == "lines":  # a crawl's parts: their bytes joined a run at a time, parsed at once
            yield from _joined(_jsonl_files(list(run), options, seen_ids, batch_bytes, paths_named), batch_bytes)
        else:
            yield from _joined(_by_piece(run, options, seen_ids, batch_bytes, columnar, paths_named), batch_bytes)


def _whole_files(piece: Piece, options: ReadOptions) -> Literal["documents", "lines"] | None:
    """Whether the piece is a whole file read in a run of its neighbours (`read_documents`): a text file of one
    document, or an uncompressed JSON Lines file on the columnar path."""
    if one_document(piece, options):
        return "documents"
    plain = piece.whole and kind_of(piece, options) == "jsonl" and compression_of(piece.path) is None
    return "lines" if plain and fast_path_applies(piece, options) else None


def _by_piece(
    pieces: Iterable[Piece],
    options: ReadOptions,
    seen_ids: set[str],
    batch_bytes: int,
    columnar: bool,
    paths_named: dict[str, set[str]],
) -> Iterator[tuple[Batch, list[Reject], Piece | None]]:
    """Each piece's batches, read by its fast path where it applies (`columnar`), each with its piece where it is a
    whole file's only batch, on its columns and without rejects: a small file's, which `_joined` joins to others."""
    for piece in pieces:
        if not (columnar and fast_path_applies(piece, options)):
            batches = _careful_batches(records(piece, options), options, seen_ids, batch_bytes)
            yield from ((batch, rejects, None) for batch, rejects in batches)
            continue
        own_name = len(paths_named[options.name_of(piece.path)]) == 1
        batches = FAST_READERS[kind_of(piece, options)](piece, options, seen_ids, batch_bytes, own_name)
        if (first := next(batches, None)) is None:
            continue
        batch, rejects = first
        small = piece.whole and batch.nbytes < batch_bytes and not rejects and batch.text_array is not None
        small = small and isinstance(batch.block, Piece)
        second = next(batches, None) if small else None  # the file read to its end while a small batch is held
        yield batch, rejects, piece if small and second is None else None
        if second is not None:
            yield (*second, None)
        yield from ((batch, rejects, None) for batch, rejects in batches)


def _jsonl_files(
    pieces: list[Piece],
    options: ReadOptions,
    seen_ids: set[str],
    batch_bytes: int,
    paths_named: dict[str, set[str]],
) -> Iterator[tuple[Batch, list[Reject], Piece | None]]:
    """Whole JSON Lines files, as `_by_piece` reads them, but small ones' bytes joined a run of about `batch_bytes` at
    a time and parsed at once (`_lines_batch`): pyarrow's parse costs about 0.6 ms a call however small its input.
    A run with any record that is not a valid document, and a file that is larger, blank, ends in a lone carriage
    return, holds an array or cannot be read, are read file by file (`_by_piece`: the same documents and rejects)."""

    def by_piece(run: list[Piece]) -> Iterator[tuple[Batch, list[Reject], Piece | None]]:
        return _by_piece(run, options, seen_ids, batch_bytes, True, paths_named)

    def read(run: list[tuple[Piece, bytes]]) -> Iterator[tuple[Batch, list[Reject], Piece | None]]:
        batch = _lines_batch(run, options, seen_ids, paths_named)
        return iter([(batch, [], None)]) if batch is not None else by_piece([piece for piece, _ in run])

    run: list[tuple[Piece, bytes]] = []
    held = 0
    for piece, data in _contents(pieces, options, most=batch_bytes):
        if data is None or _blank(data) or data.endswith(b"\r") or (may_hold_array(piece.path) and starts_array(data)):
            if run:
                yield from read(run)
                run, held = [], 0
            yield from by_piece([piece])
            continue
        run.append((piece, data))
        held += len(data)
        if held >= batch_bytes:
            yield from read(run)
            run, held = [], 0
    if run:
        yield from read(run)


def _lines_batch(
    run: list[tuple[Piece, bytes]], options: ReadOptions, seen_ids: set[str], paths_named: dict[str, set[str]]
) -> Batch | None:
    """The documents of whole JSON Lines files (each its bytes) parsed as one block, each named by its file and line
    (`LineIds`, a name per document), its block their pieces; None unless every record is a valid document."""
    parts = [part for _, data in run for part in ((data,) if data.endswith(b"\n") else (data, b"\n"))]
    joined = b"".join(parts)
    lines = np.array([count_newlines(data) + (not data.endswith(b"\n")) for _, data in run], np.int64)
    table = _arrow_table(joined, options)
    if table is None or table.num_rows != lines.sum():
        return None
    names = [options.name_of(piece.path) for piece, _ in run]
    doc_lines = np.arange(lines.sum(), dtype=np.int64) - np.repeat(np.cumsum(lines) - lines, lines) + 1
    own_names = all(len(paths_named[name]) == 1 for name in names)
    read = _table_batch(table, doc_lines, _each_document(names, lines), options, seen_ids, own_names, partial=False)
    if read is None:
        return None
    batch, _ = read
    batch.nbytes = len(joined) - int(lines.sum()) - count_crlf(joined)  # as `_fast_batch` counts each file's
    batch.lines = int(lines.sum())
    batch.block = [piece for piece, _ in run]
    paths = (itertools.repeat(piece.path, n) for (piece, _), n in zip(run, lines.tolist(), strict=True))
    batch.doc_files = list(itertools.chain.from_iterable(paths))  # not a Python index a document
    return batch


def _each_document(names: list[str], counts: Sequence[int]) -> pyarrow.Array:
    """Each document's file name, of files of `counts` documents each, in order: taken by arrow, no Python string a
    document (`LineIds` keeps them so)."""
    return pyarrow.array(names, pyarrow.string()).take(pyarrow.array(np.repeat(np.arange(len(names)), counts)))


def _joined(
    read: Iterator[tuple[Batch, list[Reject], Piece | None]], batch_bytes: int
) -> Iterator[tuple[Batch, list[Reject]]]:
    """`_by_piece`'s batches, neighbouring small files' joined into one of about `batch_bytes`, its block their
    pieces: a batch a file of a web crawl's 100 KB files cost the encoder's call and the tokenize stage's bookkeeping
    a file (2 ms here, more than such a file's own parse and encoding)."""
    held: list[tuple[Batch, Piece]] = []
    held_bytes = 0
    for batch, rejects, small in read:
        if held and (small is None or batch.text_array.type != held[0][0].text_array.type):
            yield _join(held), []
            held, held_bytes = [], 0
        if small is None:
            yield batch, rejects
            continue
        held.append((batch, small))
        held_bytes += batch.nbytes
        if held_bytes >= batch_bytes:
            yield _join(held), []
            held, held_bytes = [], 0
    if held:
        yield _join(held), []


def _join(held: list[tuple[Batch, Piece]]) -> Batch:
    """Small files' batches (each its file's only one, and its piece) as one batch whose block is those pieces."""
    if len(held) == 1:
        return held[0][0]
    batches = [batch for batch, _ in held]
    if all(isinstance(batch.ids, LineIds) for batch in batches):  # kept lazy: a name per document, taken by arrow
        names = _each_document([batch.ids.name for batch in batches], [len(batch.ids) for batch in batches])
        ids = LineIds(names, np.concatenate([batch.ids.lines for batch in batches]))
    else:
        ids = [i for batch in batches for i in batch.ids]
    return Batch(
        ids=ids,
        nbytes=sum(batch.nbytes for batch in batches),
        text_array=pyarrow.concat_arrays([batch.text_array for batch in batches]),
        extra={f: [v for batch in batches for v in batch.extra[f]] for f in batches[0].extra},
        lines=sum(batch.lines for batch in batches),
        block=[piece for _, piece in held],
        doc_files=[path for batch in batches for path in batch.doc_files],
        doc_lines=np.concatenate([np.asarray(batch.doc_lines, np.int64) for batch in batches]),
    )


def _careful_batches(
    stream: Iterator[Record], options: ReadOptions, seen_ids: set[str], batch_bytes: int
) -> Iterator[tuple[Batch, list[Reject]]]:
    """The records of `stream`, checked a batch of about `batch_bytes` at a time (`_checked`)."""
    pending: list[Record] = []
    pending_bytes = 0
    while True:
        raw = next(stream, None)
        if raw is not None:
            pending.append(raw)
            pending_bytes += raw.size
            if pending_bytes < batch_bytes:
                continue
        if pending:
            yield _checked(pending, options, seen_ids)
            pending, pending_bytes = [], 0
        if raw is None:
            break


def _read_on(
    piece: Piece, options: ReadOptions, seen_ids: set[str], batch_bytes: int, count: int
) -> Iterator[tuple[Batch, list[Reject]]]:
    """Where a fast path could not read on: the piece record by record after its first `count` records, so that the
    records kept, and the reject that says where reading stopped, are the careful reader's."""
    yield from _careful_batches(itertools.islice(records(piece, options), count, None), options, seen_ids, batch_bytes)


def _checked(raws: list[Record], options: ReadOptions, seen_ids: set[str]) -> tuple[Batch, list[Reject]]:
    if options.conversations:
        return _checked_conversations(raws, options, seen_ids)
    problems = _validate(raws, options, seen_ids)
    if problems and options.on_invalid == "fail":
        first = raws[min(problems)]
        where = "the file" if first.line == 0 else f"line {first.line}"
        raise InputError(f"{first.file}, {where}: {problems[min(problems)]}")
    batch = Batch(extra={f: [] for f in options.fields})
    rejects = []
    for i, raw in enumerate(raws):
        if i in problems:
            rejects.append(Reject(raw.file, raw.line, problems[i], _shorten(raw.raw)))
            continue
        doc_id = str(raw.doc_id)
        seen_ids.add(doc_id)
        batch.add(raw, doc_id, raw.text, options.fields)
    return batch, rejects


def _checked_conversations(raws: list[Record], options: ReadOptions, seen_ids: set[str]) -> tuple[Batch, list[Reject]]:
    """`_checked` for conversations: each record rendered with its template (`ChatReading.rendered`; a preference
    pair's texts, `PairReading.rendered`); a record that makes no conversation or pair, or that the template refuses
    or renders so that its assistant turns cannot be found, is a reject naming the field and what is wrong."""
    from tokenmill.tokenizers.chat import ChatError, SpanError

    reading = options.pairs or options.chat
    if reading is None:
        raise InputError("conversations are read with their chat template (the tokenizer's install probes it)")
    batch = Batch(extra={f: [] for f in options.fields}, chats=None if options.pairs else [])
    batch.pairs, rejects = [] if options.pairs else None, []
    for raw in raws:
        problem, doc_id = raw.problem, None if raw.doc_id is None else str(raw.doc_id)
        if problem is None and doc_id is None:
            problem = id_missing(options)
        elif problem is None and doc_id in seen_ids:
            problem = DUPLICATE
        elif problem is None:
            try:
                rendered = reading.rendered(raw.text)
            except (ChatError, SpanError) as e:
                problem = str(e)
        if problem is not None and options.on_invalid == "fail":
            where = "the file" if raw.line == 0 else f"line {raw.line}"
            raise InputError(f"{raw.file}, {where}: {problem}")
        if problem is not None:
            rejects.append(Reject(raw.file, raw.line, problem, _shorten(raw.raw)))
            continue
        seen_ids.add(doc_id)
        batch.add(raw, doc_id, rendered.text, options.fields)
        (batch.chats if batch.pairs is None else batch.pairs).append(rendered)
    return batch, rejects


# --- the columnar fast path -------------------------------------------------------------------------------
# JSONL with top-level text, id and extra fields (plain, compressed, or a JSON array file's lines) is parsed by
# pyarrow a block of whole lines at a time (Parquet and Arrow are read a batch of rows at a time, text split by a
# separator a run of documents), and the batch schema's checks run vectorised on the columns: a record whose text is
# missing or out of bounds, or whose id is missing or repeated, is a reject with the reason, line and record the careful
# path gives it (`_row_problems`), the others the batch's documents. A block pyarrow cannot read as such columns (a
# parse error, invalid UTF-8, a line of spaces, a text, id or extra field of another type: `_arrow_table`), and a text
# file's run with a problem, is read again by the careful path above, record by record, so every bad record still
# becomes a reject naming its file, line and reason, exactly as without the fast path. pyarrow and orjson decode
# escaped surrogates alike (pairs to the same UTF-8, a lone or misordered one is an error to both:
# tested), so escapes need no scan of their own.


def fast_path_applies(piece: Piece, options: ReadOptions) -> bool:
    tabular = kind_of(piece, options) in ("jsonl", *TABLES) and not options.conversations
    return tabular or separated_text(piece, options)


def _fast_jsonl(
    piece: Piece, options: ReadOptions, seen_ids: set[str], batch_bytes: int, own_name: bool = False
) -> Iterator[tuple[Batch, list[Reject]]]:
    name, read_any = options.name_of(piece.path), False
    counted = piece.first_line is not None
    # A block is a piece of the file to read again: a compressed stream's by its place in the decompressed stream
    # (read again by decompressing up to it: no parse), an array's by its records' place (`arrays.ArrayStream`)
    array = holds_array(piece, options)
    count = 0  # the records read
    try:
        for block, line, newlines, start in line_blocks(piece, options, batch_bytes, array):
            read_any = True
            batch, rejects = jsonl_block(block, line, name, options, seen_ids, newlines, own_name)
            count += len(batch) + len(rejects)
            batch.lines = newlines + (block[-1:] != b"\n")
            batch.block = Piece(piece.path, start, start + len(block), line)
            batch.doc_files = [piece.path] * len(batch)  # a block is of one file (its careful path names none)
            for reject in [] if counted else rejects:
                reject.from_byte = piece.start
            yield batch, rejects
    except FileNotFoundError as e:
        raise InputError(f"{piece.path}: no such file") from e
    except CORRUPT_STREAM:  # a block read where the stream broke went with it
        yield from _read_on(piece, options, seen_ids, batch_bytes, count)
        return
    except InputError as e:  # a bad record under `fail`, in a piece whose first line was not counted
        if counted:
            raise
        raise InputError(
            f"{e} (lines counted from byte {piece.start}, where this shard's piece of the file starts)"
        ) from None
    if piece.start == 0 and not read_any:  # an empty file: the careful path says so
        yield from read_documents([piece], options)


def count_newlines(data: Buffer) -> int:
    """The line endings in `data`, vectorised (2.5x `bytes.count`), a part at a time (`scan_parts`)."""
    return sum(int(np.count_nonzero(part == 10)) for _, part in scan_parts(np.frombuffer(data, np.uint8)))


def count_crlf(data: Buffer) -> int:
    """The CRLF line endings in `data`, vectorised; a block with no carriage return at all costs one search."""
    if not _holds_carriage_return(data):
        return 0
    data = np.frombuffer(data, np.uint8)
    returns = np.flatnonzero(data[:-1] == 13)
    return int(np.count_nonzero(data[returns + 1] == 10))


def _holds_carriage_return(data: Buffer) -> bool:
    """Whether `data` holds a CR: searched in place at memchr's speed (5x numpy's comparison) where `data` is bytes
    or a view of bytes or of a memory map (as `mapped` makes them)."""
    owner = data.obj if isinstance(data, memoryview) and data.contiguous else data
    if isinstance(owner, bytes | mmap.mmap):
        offset = np.frombuffer(data, np.uint8).ctypes.data - np.frombuffer(owner, np.uint8).ctypes.data
        return owner.find(b"\r", offset, offset + len(data)) >= 0
    return bool((np.frombuffer(data, np.uint8) == 13).any())


def line_start(f: BinaryIO, target: int) -> int:
    """Where a line of the seekable file `f` starts at or after `target`: just past the first newline at or after
    max(target - 1, 0), or at the file's end."""
    position = f.seek(max(target - 1, 0))
    while chunk := f.read(LINE_PROBE):
        if (nl := chunk.find(b"\n")) >= 0:
            return position + nl + 1
        position += len(chunk)
    return position


def line_blocks(
    piece: Piece, options: ReadOptions, batch_bytes: int = BATCH_BYTES, array: bool = False
) -> Iterator[tuple[Buffer, int, int, int]]:
    """A line-based piece as blocks of whole lines of about `batch_bytes`: (block, the number of its first line,
    the line endings it holds, where it starts), each block bytes or a memoryview. Nothing for an empty file.
    `array`: the piece is a file of one JSON array (`holds_array`), read as the JSON Lines of its records."""
    line = piece.first_line or 1
    for pos, block in _whole_line_blocks(piece, options, batch_bytes, array):
        if pos == 0 and _blank(block):
            break
        newlines = count_newlines(block)  # once per block: it is a pass over 8 MB
        yield block, line, newlines, pos
        line += newlines + (block[-1:] != b"\n")


def _whole_line_blocks(
    piece: Piece, options: ReadOptions, batch_bytes: int, array: bool
) -> Iterator[tuple[int, Buffer]]:
    """(where it starts, the block) for the piece's lines, in blocks of whole lines of about `batch_bytes`: the lines
    that start in the piece (`first_line_at`: a plain file's pieces start and end at line starts, a compressed one's
    anywhere). A local uncompressed file's blocks are views of a memory map each, not copies: reading 8 MB blocks into
    fresh buffers cost 40% as much CPU as parsing them. A block's map goes with its last view, so a worker's memory
    holds a block or two of the file."""
    fs, path = fsspec.core.url_to_fs(piece.path, **options_for(piece.path, options.storage_options))
    if isinstance(fs, LocalFileSystem) and compression_of(piece.path) is None and not array:
        with open(path, "rb") as f:
            status = os.fstat(f.fileno())
            if stat.S_ISREG(status.st_mode):  # not a pipe or a device: those have no size to map
                end = status.st_size if piece.end is None else min(piece.end, status.st_size)
                start = piece.start
                for block in _local_blocks(f, path, piece.start, end, batch_bytes):
                    yield start, block
                    start += len(block)
                return
    # A short piece (a block validate reads again) is read alone, not with an object store's read-ahead (s3fs: 50 MB);
    # but a compressed one is decompressed from the file's start
    short = piece.end is not None and piece.end - piece.start <= 2 * batch_bytes and compression_of(piece.path) is None
    with open_piece(piece, options, LINE_PROBE if short else None) as f:  # a read and its line's end
        pos = first_line_at(f, piece.start)
        while pos is not None and (piece.end is None or pos < piece.end):
            block = f.read(batch_bytes if piece.end is None else min(batch_bytes, piece.end - pos))
            if block and not block.endswith(b"\n"):
                block += f.readline()  # whole lines only: a line that starts in the piece is read to its end
            if not block:
                break
            yield pos, block
            pos += len(block)


def _local_blocks(f: BinaryIO, path: str, start: int, end: int, batch_bytes: int) -> Iterator[memoryview]:
    """Bytes [start, end) of the local file `f`, in blocks of whole lines from `batch_bytes` to the end of the line
    it ends in. Blocks in the page cache are views of memory maps; the others are read with O_DIRECT into one of
    two reused buffers, the next block while the caller parses this one: a memory map faulting its pages in from
    disk cost two workers reading at once 0.2-0.6 s more CPU per GB than reads that skip the page cache (and the
    whole run 20% more wall), and the page cache is left to the output. A block read so is valid until the next
    one is asked for (its readers copy what they keep: pyarrow's parse, the careful path's `bytes`)."""
    direct = open_direct(path) if end - start > 2 * batch_bytes else None  # a block or two: little to read ahead
    if direct is None:
        for stop in _block_ends(f, start, end, batch_bytes):
            yield mapped(f, start, stop)
            start = stop
        return
    pages = -(-(batch_bytes + LONG_LINE) // DIRECT_ALIGN) + 1  # one more: a block starts anywhere in its first
    buffers = [mmap.mmap(-1, pages * DIRECT_ALIGN) for _ in range(2)]
    pool = ThreadPoolExecutor(1, thread_name_prefix="tokenmill-read-ahead")
    try:
        reading = pool.submit(_next_block, f, direct, buffers[0], start, end, batch_bytes)
        for turn in itertools.count(1):
            block = reading.result()
            start += len(block)
            reading = pool.submit(_next_block, f, direct, buffers[turn % 2], start, end, batch_bytes)
            yield block
            if start >= end:
                break
    finally:
        pool.shutdown()  # the read ahead is done with the file before it closes
        os.close(direct)


def _block_ends(f: BinaryIO, start: int, end: int, batch_bytes: int) -> Iterator[int]:
    """Where each block of `_local_blocks` ends: the first line start at or after `batch_bytes` from its start."""
    while start < end:
        start = end if start + batch_bytes >= end else min(line_start(f, start + batch_bytes), end)
        yield start


def _next_block(f: BinaryIO, direct: int, buffer: mmap.mmap, start: int, end: int, batch_bytes: int) -> memoryview:
    """The block of `_local_blocks` at `start` (nothing at `end`): mapped where its pages are in the page cache, or
    its line past `batch_bytes` is longer than LONG_LINE, else read into `buffer` from `direct`."""
    if start >= end:
        return memoryview(b"")
    if not in_page_cache(f, start, min(start + batch_bytes, end)):
        base, held = read_direct(direct, buffer, start, end) or (0, 0)  # refused: read it mapped
        held = min(held, end - base)
        stop = 0 if start + batch_bytes >= end else buffer.find(b"\n", start + batch_bytes - 1 - base, held) + 1
        if not stop and held == end - base:  # the piece's last block
            stop = held
        if stop:
            return memoryview(buffer)[start - base : stop]
    return mapped(f, start, next(_block_ends(f, start, end, batch_bytes)))


def _blank(block: Buffer) -> bool:
    """Whether the block is whitespace only (copied whole only when its start is)."""
    return not bytes(block[:4096]).strip() and not bytes(block).strip()


def jsonl_block(
    block: Buffer,
    first_line: int,
    name: str,
    options: ReadOptions,
    seen_ids: set[str],
    newlines: int | None = None,
    own_name: bool = False,
) -> tuple[Batch, list[Reject]]:
    """The documents and rejects of a block of whole JSONL lines (holding `newlines` line endings, when the caller
    counted them) whose first is line `first_line` of file `name`: parsed by pyarrow where it can read every record
    as columns of strings (`_fast_batch`), else record by record. With `own_name`, no other file of the shard is
    called `name`, so its ids `<file>:<line>` need no check against `seen_ids` (nor go into it)."""
    newlines = count_newlines(block) if newlines is None else newlines
    read = _fast_batch(block, newlines, first_line, name, options, seen_ids, own_name)
    return read if read is not None else _careful_block(block, first_line, name, options, seen_ids)


def _fast_batch(
    block: Buffer, newlines: int, first_line: int, name: str, options: ReadOptions, seen_ids: set[str], own_name: bool
) -> tuple[Batch, list[Reject]] | None:
    """The block's documents and rejects read by its columns (`_table_batch`), or None where they cannot be (a record
    pyarrow cannot parse as one of strings, a line of blanks)."""
    if (table := _arrow_table(block, options)) is None:
        return None
    lines = newlines + (block[-1:] != b"\n")
    records = np.arange(lines) if table.num_rows == lines else _record_lines(block, lines)  # pyarrow skips blanks
    if len(records) != table.num_rows:
        return None
    doc_lines = first_line + records
    if (read := _table_batch(table, doc_lines, name, options, seen_ids, own_name)) is None:
        return None
    batch, problems = read
    rows = sorted(problems)
    bad = [line.rstrip(b"\r") for line in lines_at(block, records[rows].tolist())]  # as the careful path reads one
    rejects = [Reject(name, int(doc_lines[k]), problems[k], _shorten(line)) for k, line in zip(rows, bad, strict=True)]
    # bytes as the careful path counts them: each document's line without its line ending
    batch.nbytes = len(block) - newlines - count_crlf(block) - sum(map(len, bad))
    return batch, rejects


def _record_lines(block: Buffer, lines: int) -> np.ndarray:
    """The block's lines (from 0) that are not empty (nor a lone carriage return, of a CR LF): those that hold its
    records where its other lines are such blanks (a block with a line of spaces is read record by record)."""
    data = np.frombuffer(block, np.uint8)
    ends = np.append(np.flatnonzero(data == 10), len(data))[:lines]
    starts = np.concatenate([[0], ends[:-1] + 1])
    sizes = ends - starts
    return np.flatnonzero((sizes > 1) | ((sizes == 1) & (data[np.minimum(starts, len(data) - 1)] != 13)))


def lines_at(block: Buffer, rows: Sequence[int]) -> list[bytes]:
    """The block's lines numbered `rows` (from 0), without their line endings' `\\n`."""
    if not rows:
        return []
    ends = np.append(np.flatnonzero(np.frombuffer(block, np.uint8) == 10), len(block))
    return [bytes(block[(int(ends[k - 1]) + 1 if k else 0) : int(ends[k])]) for k in rows]


def holds_strings(t: pyarrow.DataType) -> bool:
    """Whether a column of type `t` holds strings: Arrow's string, large string (as polars writes Parquet) or string
    view (as polars writes Arrow files)."""
    return pyarrow.types.is_string(t) or pyarrow.types.is_large_string(t) or pyarrow.types.is_string_view(t)


def _table_batch(
    table: pyarrow.Table,
    doc_lines: np.ndarray,
    name: str | pyarrow.Array,
    options: ReadOptions,
    seen_ids: set[str],
    own_name: bool,
    partial: bool = True,
) -> tuple[Batch, dict[int, str]] | None:
    """The valid documents of a table of records, each from its line (or a Parquet file's row) of `doc_lines`, checked
    on the columns (`record_schema`'s checks: `_row_problems`), and the reason each other row is not one, by its row in
    the table; their ids are the shard's now. None, with no id taken, where the text or the id is not a column of
    strings, or a row is not valid under `on_invalid: fail` (the careful path names it) or without `partial`. `name`:
    their file's, or each document's (`LineIds`)."""
    if (texts := _text_array(table, options)) is None or any(_column(table, f) is None for f in options.fields):
        return None
    ids: list | LineIds = LineIds(name, doc_lines)  # `<file>:<line>` of a name no other file has: unique
    if options.id_field is not None:
        if (id_column := _column(table, options.id_field)) is None:
            return None
        if pyarrow.types.is_integer(id_column.type):  # a whole number's id is its digits, as str() writes it
            id_column = id_column.cast(pyarrow.string())
        if not holds_strings(id_column.type):
            return None
        ids = id_column.to_pylist()
    elif not own_name:
        ids = ids.as_list()
    problems = _row_problems(texts, None if isinstance(ids, LineIds) else ids, options, seen_ids)
    if problems and (options.on_invalid == "fail" or not partial):
        return None
    if problems:
        kept = np.delete(np.arange(len(texts)), list(problems))
        table, doc_lines = table.take(kept), doc_lines[kept]
        texts = _text_array(table, options)
        ids = LineIds(name, doc_lines) if isinstance(ids, LineIds) else [ids[k] for k in kept.tolist()]
    if not isinstance(ids, LineIds):
        seen_ids.update(ids)
    extra = {f: _column(table, f).to_pylist() for f in options.fields}
    return Batch(ids=ids, nbytes=table.nbytes, text_array=texts, extra=extra, doc_lines=doc_lines), problems


def _text_array(table: pyarrow.Table, options: ReadOptions) -> pyarrow.Array | None:
    """The table's texts as one array of strings (a block's: no copy), or None where they are not strings."""
    column = _column(table, options.text_field)
    if column is None or not holds_strings(column.type):
        return None
    if pyarrow.types.is_string_view(column.type):  # the encoder reads a string array's offsets, which views lack
        column = column.cast(pyarrow.large_string())
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _claimed(ids: list[str], seen_ids: set[str]) -> bool:
    """Whether the ids are unique and new to the shard; if so, they are the shard's now."""
    if len(set(ids)) != len(ids) or not seen_ids.isdisjoint(ids):
        return False
    seen_ids.update(ids)
    return True


def _row_problems(texts: pyarrow.Array, ids: list | None, options: ReadOptions, seen_ids: set[str]) -> dict[int, str]:
    """Each row that is not a valid document -> the reason the careful path gives it (`_validate`); {} where every
    row is valid, as a few passes over the columns tell. `ids`: None where they are unique (`<file>:<line>`)."""
    checks = []  # (rows, reason), in the order of `reasons`
    if texts.null_count or not _lengths_within(texts, options):
        # A text of b bytes holds b/4 to b characters: they are counted only where that does not decide.
        most = np.inf if options.max_chars is None else options.max_chars
        sizes = pc.fill_null(pc.binary_length(texts), 0).to_numpy()  # a missing text's is 0, as `within_limits` says
        outside = (sizes < options.min_chars) | (-(-sizes // 4) > most)
        if len(unsure := np.flatnonzero(~outside & ((-(-sizes // 4) < options.min_chars) | (sizes > most)))):
            lengths = pc.utf8_length(texts.take(unsure)).to_numpy()
            outside[unsure] = (lengths < options.min_chars) | (lengths > most)
        checks += [(np.asarray(texts.is_null()), text_missing(options)), (outside, length_outside(options))]
    unique = set(ids) if ids is not None else set()
    if None in unique:
        checks.append((np.equal(ids, None), id_missing(options)))
    problems: dict[int, str] = {}
    for rows, reason in checks:
        for k in np.flatnonzero(rows).tolist():
            problems.setdefault(k, reason)
    if ids is not None and (len(unique) != len(ids) or not seen_ids.isdisjoint(unique)):  # Python per id: rare
        _repeated_ids(ids, problems, seen_ids)
    return problems


def _fast_tables(
    piece: Piece, options: ReadOptions, seen_ids: set[str], batch_bytes: int, own_name: bool = False
) -> Iterator[tuple[Batch, list[Reject]]]:
    """A Parquet or Arrow piece a batch of rows at a time, each checked on its columns (`_table_batch`), or record by
    record where any is not a valid document; a batch's block is its group of rows."""
    name, count = options.name_of(piece.path), 0  # the records read
    try:
        block = None
        for group, first, table in TABLES[kind_of(piece, options)](piece, options, name, batch_bytes):
            read = _table_batch(table, np.arange(first, first + table.num_rows), name, options, seen_ids, own_name)
            if read is None:
                raws = list(_table_records(table, first, options, name))
                for raw in raws:
                    raw.file, raw.path = name, piece.path
                batch, rejects = _checked(raws, options, seen_ids)
            else:
                batch, problems = read
                batch.doc_files, rejects = [piece.path] * len(batch), []
                for k in sorted(problems):  # as the careful path makes its record
                    (raw,) = _table_records(table.slice(k, 1), first + k, options, name)
                    rejects.append(Reject(name, raw.line, problems[k], _shorten(raw.raw)))
            if block is None or block.row_groups != [group]:  # its first batch: the block starts at its first row
                block = Piece(piece.path, piece.start, piece.end, first, row_groups=[group])
            batch.block = block  # validate re-reads a group alone, not the shard
            count += table.num_rows
            yield batch, rejects
    except FileNotFoundError as e:
        raise InputError(f"{piece.path}: no such file") from e
    except InputError:
        raise
    except Exception:  # unreadable from some row group on
        yield from _read_on(piece, options, seen_ids, batch_bytes, count)
        return
    if count == 0 and piece.row_groups is None:  # an empty file: the careful path says so
        yield from _read_on(piece, options, seen_ids, batch_bytes, 0)


def _fast_text(
    piece: Piece, options: ReadOptions, seen_ids: set[str], batch_bytes: int, own_name: bool = False
) -> Iterator[tuple[Batch, list[Reject]]]:
    """A text file split by separator lines (`_separated`), a batch of its documents of about `batch_bytes` of text at
    a time, each batch a piece of the file (validate reads it again alone) that `_text_batch` checks on its columns."""
    name, path = options.name_of(piece.path), piece.path
    count = 0  # the records read (as `records` counts them: documents and rejects)
    try:
        with open_piece(piece, options) as f:
            _skip_to(f, 0, piece.start)
            left = None if piece.end is None else piece.end - piece.start
            start, line, separator = piece.start, piece.first_line or 1, options.separator.encode()
            for documents, end, after in _runs(_separated(f, separator, line, left), batch_bytes):
                batch, rejects = _text_batch(documents, name, path, options, seen_ids, own_name)
                count += len(batch) + len(rejects)
                batch.lines, batch.doc_files = after - line, [path] * len(batch)
                batch.block = Piece(path, start, piece.start + end, line)
                if len(batch) or rejects:  # not a run of blank documents (an empty file's: said below)
                    yield batch, rejects
                start, line = piece.start + end, after
    except FileNotFoundError as e:
        raise InputError(f"{piece.path}: no such file") from e
    except CORRUPT_STREAM:  # a cut compressed file: where it breaks, as the careful reader says it
        yield from _read_on(piece, options, seen_ids, batch_bytes, count)
        return
    if piece.start == 0 and count == 0:  # an empty (or blank) file: the careful path says so
        yield from _read_on(piece, options, seen_ids, batch_bytes, 0)


def _fast_files(
    pieces: list[Piece], options: ReadOptions, seen_ids: set[str], batch_bytes: int
) -> Iterator[tuple[Batch, list[Reject]]]:
    """Text files of one document each (`one_document`), read a run of about `batch_bytes` of them at a time and
    checked on their columns (`_files_batch`), where a batch a file would cost more than the file. A batch's block is
    its files. A file that cannot be read is read by the careful path, which says why (or fails the run: it is gone)."""
    run: list[tuple[Piece, bytes]] = []
    held = 0
    for piece, data in _contents(pieces, options):
        if data is None:
            if run:
                yield _files_batch(run, options, seen_ids)
                run, held = [], 0
            yield from _careful_batches(records(piece, options), options, seen_ids, batch_bytes)
            continue
        run.append((piece, data))
        held += len(data)
        if held >= batch_bytes:
            yield _files_batch(run, options, seen_ids)
            run, held = [], 0
    if run:
        yield _files_batch(run, options, seen_ids)


def _contents(
    pieces: list[Piece], options: ReadOptions, most: int | None = None
) -> Iterator[tuple[Piece, bytes | None]]:
    """Each piece's whole content, decompressed (None where it cannot be read, or where it is not known to hold at
    most `most` bytes), in order. On an object store a request costs milliseconds whatever its size, so FILES_AHEAD
    files are read at once there (`_in_order`)."""

    def content(piece: Piece) -> bytes | None:
        try:
            if (path := local_path(piece.path)) is not None and compression_of(path) is None:
                with open(path, "rb") as f:  # not through fsspec's layers: 0.1 ms a file of a source tree's 100,000
                    status = os.fstat(f.fileno())
                    if not stat.S_ISREG(status.st_mode) or (most is not None and status.st_size > most):
                        return None
                    return f.read()
            plain = piece.whole and compression_of(piece.path) is None and not may_hold_array(piece.path)
            if plain and (most is None or piece.size is not None):  # read whatever its size, or its size known
                # an object store's file in one GET (opening it asks its size, a HEAD); at most a byte past `most`,
                # should it have grown since it was listed
                if most is not None and piece.size > most:
                    return None
                fs, path = fsspec.core.url_to_fs(piece.path, **options_for(piece.path, options.storage_options))
                data = read_object(fs, path, None if most is None else most + 1)
                return None if most is not None and len(data) > most else data
            with open_piece(piece, options) as f:
                size = getattr(f, "size", None)  # a local or object store's file; a stream has none
                return None if most is not None and (size is None or size > most) else f.read()
        except Exception:  # the careful reader says why
            return None

    yield from _in_order(content, pieces, not pieces or local_path(pieces[0].path) is not None)


def _in_order(work: Callable[[T], R], items: Sequence[T], local: bool) -> Iterator[tuple[T, R]]:
    """(item, work(item)) for each of the items (of one store's files), in order: one by one where they are `local`,
    else FILES_AHEAD at once (an object store's request costs milliseconds whatever it asks; at most as many results
    held)."""
    if local:
        yield from ((item, work(item)) for item in items)
        return
    with ThreadPoolExecutor(FILES_AHEAD) as pool:
        ahead: collections.deque = collections.deque()
        for item in items:
            ahead.append((item, pool.submit(work, item)))
            if len(ahead) > FILES_AHEAD:
                before, doing = ahead.popleft()
                yield before, doing.result()
        yield from ((item, doing.result()) for item, doing in ahead)


def _files_batch(
    run: list[tuple[Piece, bytes]], options: ReadOptions, seen_ids: set[str]
) -> tuple[Batch, list[Reject]]:
    """The files of `run` (each a document, its id the file's name), checked on their columns where each is UTF-8
    within the length limits and its name new to the shard, else record by record (`_checked`) as `records` reads
    them."""
    names = [options.name_of(piece.path) for piece, _ in run]
    try:
        texts = pyarrow.array([data for _, data in run], pyarrow.binary()).cast(pyarrow.string())
    except pyarrow.ArrowInvalid:  # not UTF-8
        texts = None
    if texts is not None and _lengths_within(texts, options) and _claimed(names, seen_ids):
        batch = Batch(ids=names, nbytes=sum(len(data) for _, data in run), text_array=texts,
                      extra={f: [None] * len(run) for f in options.fields}, doc_files=[piece.path for piece, _ in run],
                      doc_lines=np.ones(len(run), np.int64))  # fmt: skip
        rejects = []
    else:
        raws = [replace(_text_record(data, name, 1, reject_at=0), file=name, path=piece.path)
                for (piece, data), name in zip(run, names, strict=True)]  # fmt: skip
        batch, rejects = _checked(raws, options, seen_ids)
    batch.block = [piece for piece, _ in run]
    return batch, rejects


FAST_READERS = {"jsonl": _fast_jsonl, "parquet": _fast_tables, "arrow": _fast_tables, "text": _fast_text}


def _runs(
    documents: Iterator[tuple[int, bytes, int, int]], batch_bytes: int
) -> Iterator[tuple[list[tuple[int, bytes]], int, int]]:
    """`_separated`'s documents in runs of about `batch_bytes`: each run's (first line, bytes) and where it ends."""
    run, held = [], 0
    for first, data, end, after in documents:
        run.append((first, data))
        held += len(data)
        if held >= batch_bytes:
            yield run, end, after
            run, held = [], 0
    if run:
        yield run, end, after


def _text_batch(
    documents: list[tuple[int, bytes]], name: str, path: str, options: ReadOptions, seen_ids: set[str], own_name: bool
) -> tuple[Batch, list[Reject]]:
    """The documents (first line, bytes) of a text file, less blank ones: checked on their columns where each is
    UTF-8 within the length limits, else record by record (`_checked`, the rejects naming each document's line)."""
    lines = np.fromiter((first for first, _ in documents), np.int64, len(documents))
    try:
        texts = pyarrow.array([data for _, data in documents], pyarrow.binary()).cast(pyarrow.string())
    except pyarrow.ArrowInvalid:  # not UTF-8
        texts = None
    if texts is not None:
        # A character 0x21-0x7e is none of str.isspace's; a text without one is checked as str.strip() checks it
        visible = pc.match_substring_regex(texts, "[!-~]").to_numpy(zero_copy_only=False)
        unsure = np.flatnonzero(~visible)
        visible[unsure] = [bool(text.strip()) for text in texts.take(unsure).to_pylist()]
        if not visible.all():
            texts, lines = texts.filter(visible), lines[visible]
        # `<file>:<line>`: unique unless another file of the shard has the name
        ids = LineIds(name, lines) if own_name else LineIds(name, lines).as_list()
        if not len(texts) or (_lengths_within(texts, options) and (own_name or _claimed(ids, seen_ids))):
            extra = {f: [None] * len(texts) for f in options.fields}  # a text has no fields
            nbytes = pc.sum(pc.binary_length(texts)).as_py() or 0
            return Batch(ids=ids, nbytes=nbytes, text_array=texts, extra=extra, doc_lines=lines), []
    records = (_text_document(first, data, name) for first, data in documents)
    return _checked([replace(r, file=name, path=path) for r in records if r], options, seen_ids)


def _arrow_table(block: Buffer, options: ReadOptions) -> pyarrow.Table | None:
    """The block's records parsed by pyarrow, their text a column of strings, their id of strings or whole numbers (as
    many datasets number theirs), each extra field of strings, whole numbers, fractional numbers or booleans, each
    value as orjson reads it (`_retyped`, `_whole_floats`; a field at a dotted path inside its objects,
    `metadata.url`); None where pyarrow cannot parse it so (a parse error, invalid UTF-8, a field of another type, or
    of whole numbers some written as floats: `4.0`)."""
    names = tuple(n for n in (options.text_field, options.id_field, *options.fields) if n is not None)
    types, tried = dict(_LAST_TYPES.get(names, {})), []
    while types not in tried:  # a field whose numbers parse neither way (`4.0` and `4`) goes back to one tried
        tried.append(dict(types))
        if (schema := _json_schema(names, types)) is None:
            return None
        try:
            table = pj.read_json(
                pyarrow.BufferReader(block),
                read_options=pj.ReadOptions(use_threads=False, block_size=len(block) + 1),
                parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
            )
            table.validate(full=True)  # pyarrow's JSON reader takes invalid UTF-8 into its strings (~20 GB/s)
        except (pyarrow.ArrowInvalid, UnicodeDecodeError) as e:
            retyped = _retyped(str(e), types, options)
        else:
            if (retyped := _whole_floats(table, types, options)) == {}:
                _LAST_TYPES[names] = types
                return table
        if retyped is None:
            return None
        types |= retyped
    return None


# The types the last block of these fields parsed with, tried first for the next (a guess: what `_arrow_table`
# returns does not depend on it, only how many parses it takes; a field of numbers is found out at a whole parse's cost)
_LAST_TYPES: dict[tuple[str, ...], dict[str, pyarrow.DataType]] = {}
# A JSON value's type in pyarrow's parse errors ("Column(/lang) changed from string to number in row 0") -> the type
# an extra field of such values is parsed as; a number first as a fraction (`_whole_floats` tells whole numbers)
_FIELD_TYPES = {"string": pyarrow.string(), "number": pyarrow.float64(), "boolean": pyarrow.bool_()}
_ID_TYPES = {"string": pyarrow.string(), "number": pyarrow.int64()}  # an id of fractions is read record by record
_CHANGED = re.compile(r"Column\(/(.*)\) changed from \w+ to (\w+) in row")


def _retyped(error: str, types: dict, options: ReadOptions) -> dict | None:
    """The field whose values pyarrow's parse `error` found of another type, with the type to parse it as; None where
    none fits: the text not a string, the id neither a string nor a whole number, an extra field an object or array."""
    if "Failed to convert JSON to int64" in error:  # a field taken for whole numbers holds a fraction (its name untold)
        whole = [f for f, t in types.items() if t == pyarrow.int64() and f != options.id_field]
        return {f: _FIELD_TYPES["number"] for f in whole} or None
    if (changed := _CHANGED.search(error)) is None:
        return None
    name, found = changed[1].replace("/", "."), changed[2]
    kinds = _ID_TYPES if name == options.id_field else _FIELD_TYPES if name in options.fields else {}
    if (to := kinds.get(found)) is None or to == types.get(name, pyarrow.string()):
        return None
    return {name: to}


def _whole_floats(table: pyarrow.Table, types: dict, options: ReadOptions) -> dict | None:
    """{} where each extra field parsed as fractions holds no whole number: the values are as orjson reads them (a
    fraction written `2.5`, `1e-3`; a whole number is written so only as a float). Else the fields whose every value is
    whole, to parse again as whole numbers (`"count": 17` is the int 17 to orjson, and its text "17", not "17.0"), or
    None where a field holds both (`2` and `2.0` parse alike: record by record tells them apart)."""
    again = {}
    for name in (f for f in options.fields if types.get(f) == pyarrow.float64()):
        values = pc.drop_null(_column(table, name)).to_numpy()
        whole = np.isfinite(values) & (values == np.floor(values))
        if whole.all():
            again[name] = pyarrow.int64()
        elif whole.any():
            return None
    return again


def _json_schema(names: Sequence[str], types: dict) -> pyarrow.Schema | None:
    """The schema pyarrow's JSON reader is to parse the fields `names` (paths into objects: `metadata.url`) with:
    strings, or the type `types` gives a name; None where one is inside another (`metadata` and `metadata.url`)."""
    tree: dict = {}
    for name in dict.fromkeys(names):
        node, (*parents, leaf) = tree, name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                return None
        if leaf in node:
            return None
        node[leaf] = types.get(name, pyarrow.string())

    def fields(node: dict) -> list[pyarrow.Field]:
        return [pyarrow.field(k, pyarrow.struct(fields(v)) if isinstance(v, dict) else v) for k, v in node.items()]

    return pyarrow.schema(fields(tree))


def _column(table: pyarrow.Table, dotted: str) -> pyarrow.ChunkedArray | None:
    """The table's column at a path into its struct columns (`metadata.url`: null where `metadata` is), or None where
    a part of the path is not a struct's field."""
    top, *inner = dotted.split(".")
    column = table.column(top)
    for part in inner:
        if not pyarrow.types.is_struct(column.type) or column.type.get_field_index(part) < 0:
            return None
        column = pc.struct_field(column, part)
    return column


def _arrow_record(line: bytes, options: ReadOptions) -> dict | None:
    """One line as the fast path's parser reads it (`_arrow_table`), for a line orjson refuses; None where pyarrow
    refuses it too."""
    table = _arrow_table(line, options)
    return table.to_pylist()[0] if table is not None and table.num_rows == 1 else None


def _lengths_within(texts: pyarrow.Array, options: ReadOptions) -> bool:
    """Whether every text's length in characters is within the limits. A character is 1 to 4 UTF-8 bytes, so the
    byte lengths (read off the offsets) usually decide; the characters are counted only where they do not."""

    def within(fewest: int, most: int) -> bool:
        return fewest >= options.min_chars and (options.max_chars is None or most <= options.max_chars)

    nbytes = pc.min_max(pc.binary_length(texts)).as_py()
    if within(-(-nbytes["min"] // 4), nbytes["max"]):  # at least bytes/4 characters, at most bytes
        return True
    chars = pc.min_max(pc.utf8_length(texts)).as_py()
    return within(chars["min"], chars["max"])


def _careful_block(
    block: Buffer, first_line: int, name: str, options: ReadOptions, seen_ids: set[str]
) -> tuple[Batch, list[Reject]]:
    """The block read record by record, as `_jsonl_records` and `_checked` read a file."""
    records = []
    for number, line in enumerate(bytes(block).split(b"\n"), start=first_line):
        line = line.rstrip(b"\r")
        if line.strip():
            record = _parse_json_line(number, line, options, name)
            record.file = name
            records.append(record)
    return _checked(records, options, seen_ids) if records else (Batch(), [])
