"""Reading documents out of input files: JSONL, plain or compressed (.gz, .zst), whole or by byte range.

A shard is a list of pieces; a piece is one file, or a newline-aligned byte range of an uncompressed
file whose first line number the partition recorded. Every line of a piece is either a document or a
reject with its file, line and reason: nothing is dropped without a record.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import fsspec
import orjson

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
BATCH_BYTES = 8 << 20  # text per batch handed to the encoder: bounds memory, not documents


def compression_of(url: str) -> str | None:
    for suffix, codec in COMPRESSIONS.items():
        if url.endswith(suffix):
            return codec
    return None


def display_name(url: str) -> str:
    """The file name used in document ids and messages: stable whatever directory the corpus sits in."""
    return url.rstrip("/").rsplit("/", 1)[-1]


@dataclass
class Piece:
    path: str
    start: int = 0  # byte offset in the uncompressed stream (always 0 for compressed files)
    end: int | None = None  # exclusive; None: to the end of the file
    first_line: int = 1


@dataclass
class Batch:
    ids: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    nbytes: int = 0

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Reject:
    file: str
    line: int
    reason: str
    record: str  # the raw line, cut to a readable length

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "reason": self.reason, "record": self.record}


class InputError(Exception):
    """An input file that cannot be read at all (missing, truncated, not decompressible)."""


def _lines(piece: Piece) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line) for every line of the piece, newline stripped."""
    try:
        with fsspec.open(piece.path, "rb", compression=compression_of(piece.path)) as f:
            if piece.start:
                f.seek(piece.start)
            pos, number = piece.start, piece.first_line
            for line in f:
                if piece.end is not None and pos >= piece.end:
                    break
                pos += len(line)
                yield number, line.rstrip(b"\r\n")
                number += 1
    except FileNotFoundError as e:
        raise InputError(f"{piece.path}: no such file") from e
    except (EOFError, OSError) as e:  # truncated gzip, corrupt zstd frame, ...
        raise InputError(f"{piece.path}: cannot be read ({type(e).__name__}: {e})") from e


def _field(record: dict, dotted: str):
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def read_documents(pieces: list[Piece], text_field: str, id_field: str | None) -> Iterator[tuple[Batch, list[Reject]]]:
    """Yield (batch of documents, rejects seen since the previous batch), batches of about BATCH_BYTES."""
    batch, rejects = Batch(), []
    for piece in pieces:
        name = display_name(piece.path)
        for number, line in _lines(piece):
            if not line.strip():
                continue  # blank lines separate nothing in JSONL; they are not records
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                rejects.append(Reject(name, number, f"malformed JSON: {e}", _shorten(line)))
                continue
            text = _field(record, text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                what = "missing" if text is None else f"not a string ({type(text).__name__})"
                rejects.append(Reject(name, number, f"text field {text_field!r} {what}", _shorten(line)))
                continue
            doc_id = f"{name}:{number}" if id_field is None else _field(record, id_field)
            if doc_id is None:
                rejects.append(Reject(name, number, f"id field {id_field!r} missing", _shorten(line)))
                continue
            batch.ids.append(str(doc_id))
            batch.texts.append(text)
            batch.nbytes += len(line)
            if batch.nbytes >= BATCH_BYTES:
                yield batch, rejects
                batch, rejects = Batch(), []
    if batch.ids or rejects:
        yield batch, rejects


def _shorten(line: bytes, limit: int = 2000) -> str:
    text = line.decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[:limit] + "..."
