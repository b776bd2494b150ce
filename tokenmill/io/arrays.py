"""A file that holds one JSON array of records (Alpaca's, LLaMA-Factory's and ShareGPT's datasets), read as the
JSON Lines it stands for: each record's own bytes on a line of their own, so that the JSONL readers take it as they
take any line, and a record's number in the array is its line number. Read a chunk at a time: memory holds a
record or two, however large the file."""

from __future__ import annotations

import codecs
import io
import json
import re
from collections.abc import Iterator
from typing import BinaryIO

from tokenmill.io.names import uncompressed_name

ARRAY_PROBE = 64 << 10  # how far into a file its first character is looked for
CHUNK = 1 << 20
BLANK = re.compile(r"[ \t\r\n]*")
STRICT, LENIENT = json.JSONDecoder(), json.JSONDecoder(strict=False)  # lenient: raw control characters in strings


class JSONArrayError(ValueError):
    """A JSON array file that cannot be read on from some point: malformed between its records, or cut short."""


def may_hold_array(url: str) -> bool:
    """Whether a JSON input file may hold one array rather than lines: its name ends in .json (then perhaps a
    compression's), as the Hugging Face datasets' json loader reads either; .jsonl and .ndjson name lines."""
    return uncompressed_name(url).endswith(".json")


def opens_array(f: BinaryIO) -> bool:
    """Whether the stream's first character (blanks aside) opens an array. The stream is left where it was: at
    its start, peeked or read and sought back."""
    if hasattr(f, "peek"):
        head = f.peek(ARRAY_PROBE)
    elif f.seekable():
        head = f.read(ARRAY_PROBE)
        f.seek(0)
    else:
        return False
    return head.removeprefix(codecs.BOM_UTF8).lstrip(b" \t\r\n")[:1] == b"["


def array_lines(f: BinaryIO) -> Iterator[bytes]:
    """The records of the array the stream holds, each a line: its bytes as in the file, the line breaks between
    its tokens made spaces. A record whose strings hold a raw line break (not JSON) keeps it as a carriage return,
    which the JSONL parsers refuse as they would the break. Raises JSONArrayError where the array is malformed
    between records, cut short, or followed by more than blanks."""
    text = _Text(f)
    if text.next_char() != "[":
        raise JSONArrayError("the file does not open with '['")
    text.take(1)
    if text.next_char() == "]":
        text.take(1)
    else:
        number = 0
        while True:
            number += 1
            text.next_char()
            record, valid = text.value(number)
            yield record.translate(SPACES if valid else CARRIAGE_RETURNS) + b"\n"
            following = text.next_char()
            if following == "]":
                text.take(1)
                break
            if following != ",":
                found = f"found {following!r}" if following else "the file ends"
                raise JSONArrayError(f"after record {number}, at byte {text.offset}: expected ',' or ']', {found}")
            text.take(1)
    if text.next_char():
        raise JSONArrayError(f"more than blanks after the array's end, at byte {text.offset}")


SPACES = bytes.maketrans(b"\r\n", b"  ")  # between a valid record's tokens: blanks, as spaces are
CARRIAGE_RETURNS = bytes.maketrans(b"\n", b"\r")


class _Text:
    """The file's text, decoded a chunk at a time (bytes that are not UTF-8 kept as surrogates, so a record's bytes
    come back as they were): `text[at:]` is what is not yet taken, `offset` the byte of the file it starts at."""

    def __init__(self, f: BinaryIO):
        bom = f.read(len(codecs.BOM_UTF8))  # a byte order mark (Windows tools write one) is not the text's
        self.f, self.decoder = f, codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self.text, self.at, self.offset, self.ended = "", 0, len(bom), False
        if bom != codecs.BOM_UTF8:
            self.text, self.offset = self.decoder.decode(bom), 0

    def more(self) -> bool:
        """Read on (as much again as is held, so a record spanning many chunks is parsed a few times, not once a
        chunk); False at the file's end, the text then as it was."""
        if self.ended:
            return False
        chunk = self.f.read(max(CHUNK, len(self.text) - self.at))
        self.ended = not chunk
        if decoded := self.decoder.decode(chunk, final=self.ended):  # nothing: a character's first bytes, or the end
            self.text, self.at = self.text[self.at :] + decoded, 0
        return bool(decoded) or not self.ended

    def next_char(self) -> str:
        """The next character that is not a blank (the blanks taken), or "" at the file's end."""
        while True:
            end = BLANK.match(self.text, self.at).end()
            self.offset, self.at = self.offset + end - self.at, end
            if self.at < len(self.text):
                return self.text[self.at]
            if not self.more():
                return ""

    def take(self, n: int) -> None:  # n ASCII characters
        self.at, self.offset = self.at + n, self.offset + n

    def value(self, number: int) -> tuple[bytes, bool]:
        """The JSON value starting here, record `number` of the array, as its bytes, taken; and whether it is valid
        JSON (not: it holds a raw control character in a string)."""
        while True:
            try:
                end, valid = _value_end(self.text, self.at)
            except json.JSONDecodeError as e:
                # A record cut by the chunk's end reads as malformed near that end (or as an unterminated string)
                if (e.pos >= len(self.text) - 8 or e.msg.startswith("Unterminated string")) and self.more():
                    continue
                where = self.offset + len(self.text[self.at : e.pos].encode("utf-8", "surrogateescape"))
                at = "" if e.msg.endswith(" at") else " at"  # json's "Unterminated string starting at"
                raise JSONArrayError(f"record {number}: {e.msg}{at} byte {where}") from None
            if end > len(self.text) - 8 and self.more():  # a value at the chunk's end may go on (`1.` of `1.5`)
                continue
            record = self.text[self.at : end].encode("utf-8", "surrogateescape")
            self.at, self.offset = end, self.offset + len(record)
            return record, valid


def _value_end(text: str, at: int) -> tuple[int, bool]:
    try:
        return STRICT.raw_decode(text, at)[1], True
    except json.JSONDecodeError as e:
        if not e.msg.startswith("Invalid control character"):
            raise
        return LENIENT.raw_decode(text, at)[1], False


class ArrayStream(io.RawIOBase):
    """The stream of lines `array_lines` makes of a JSON array file, as a readable binary stream. Where the array is
    malformed the stream ends, and `error` says why: raised there, it would take with it the lines a buffered read
    had gathered before it; its reader raises it once it has read to the end (`readers.open_piece`)."""

    def __init__(self, f: BinaryIO):
        self.lines, self.line, self.position = array_lines(f), b"", 0
        self.error: JSONArrayError | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.position == len(self.line):
            try:
                self.line, self.position = next(self.lines, b""), 0
            except JSONArrayError as e:
                self.error, self.line, self.position = e, b"", 0
            if not self.line:
                return 0
        n = min(len(buffer), len(self.line) - self.position)
        buffer[:n] = self.line[self.position : self.position + n]
        self.position += n
        return n
