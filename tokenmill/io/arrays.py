"""A file that holds one JSON array of records (Alpaca's, LLaMA-Factory's and ShareGPT's datasets), read as the
JSON Lines it stands for: each record's bytes on a line of their own, so that the JSONL readers take it as they take
any line, and a record's number in the array is its line number. The lines keep the file's offsets: the comma after a
record (or the array's `]`) is its line's end, and the blanks between records and line breaks between a record's
tokens are spaces, so a byte of the lines is the file's byte at the same offset, and the lines from a record's start
on are the file's bytes from there on. That is what lets the partition cut an array at records (`record_starts`) and
a piece or a block of it be read alone, from a record's start.

The records are found a chunk at a time by a vectorized scan (the quotes not escaped, the brackets and commas
outside strings, their depth); a record it cannot place as `{...}` or `[...]` between blanks and commas (a number, a
string, anything malformed between records, the file's end inside one) is parsed by `json`, which says what is
wrong and where. Memory holds a chunk or a record, however large the file."""

from __future__ import annotations

import codecs
import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property, partial
from typing import BinaryIO

import numpy as np

from tokenmill.io.buffers import scan_parts
from tokenmill.io.names import uncompressed_name

ARRAY_PROBE = 64 << 10  # how far into a file its first character is looked for
CHUNK = 8 << 20  # what the scan reads at a time
LONGEST_SCAN = 64 << 20  # a record not ended in this many bytes is parsed by `json` (it may be a bracket never closed)
EXACT_WINDOW = 4 << 10  # what json is first given of a record (grown where it needs more); a scan's after it
BLANK = re.compile(r"[ \t\r\n]*")
BLANKS = b" \t\r\n"
STRICT, LENIENT = json.JSONDecoder(), json.JSONDecoder(strict=False)  # lenient: raw control characters in strings
QUOTE, BACKSLASH, COMMA, NEWLINE, CARRIAGE_RETURN, SPACE = 0x22, 0x5C, 0x2C, 0x0A, 0x0D, 0x20
IS_BLANK = np.zeros(256, bool)
IS_BLANK[list(BLANKS)] = True
STEP = np.zeros(256, np.int8)  # the depth a byte outside strings adds: brackets; 0 else
STEP[list(b"[{")], STEP[list(b"]}")] = 1, -1
IS_STRUCTURAL = STEP != 0
IS_STRUCTURAL[[COMMA]] = True
STRUCTURAL = bytes(c if IS_STRUCTURAL[c] else 0 for c in range(256))  # for bytes.translate
BLANK_BREAKS = bytes.maketrans(b"\r\n", b"  ")  # line breaks outside strings, in the lines
OPEN, CLOSE, SEPARATOR, END, OTHER = range(5)  # the scan's events at the array's own level (depth 0 and 1)


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
    return starts_array(head)


def starts_array(head: bytes) -> bool:
    """Whether a file starting with `head` (its first ARRAY_PROBE bytes or more) holds one array: its first
    character, blanks aside, opens one."""
    return head[:ARRAY_PROBE].removeprefix(codecs.BOM_UTF8).lstrip(BLANKS)[:1] == b"["


@dataclass
class Span:
    """Records read: `ends` where each one's line ends, from `offset` (the comma after it, or the array's `]` after
    the last: `closed`), `number` the first one's place in the array, `lines` the file's bytes from `offset` as
    lines: made where they are read (a seek passes over spans it does not read: `made` makes them)."""

    offset: int
    ends: np.ndarray
    number: int
    closed: bool = False
    made: Callable[[], bytes | bytearray] | None = None

    @cached_property
    def lines(self) -> bytes | bytearray:
        return self.made()


class ArrayRecords:
    """The records of the array in the stream `f`: from the file's start (`offset` 0), or from a record's start at
    `offset`, record `number` of the array (the stream there: just after the comma before it), to the array's end
    or to `end`, a record's start."""

    def __init__(self, f: BinaryIO, offset: int = 0, end: int | None = None, number: int = 1):
        self.f, self.offset, self.end, self.number = f, offset, end, number
        self.buffer, self.at = b"", 0  # the stream read, and where the data not yet taken starts in it (`offset`)
        self.opened: bool | None = offset > 0  # None: after the array's end
        self.ended = False  # the stream has no more
        self.window = CHUNK  # what the next scan looks at: less after a record json parsed, so it costs no chunk
        self.run = 1  # records json parses in a row: more where the scan finds the next one not its own again
        self.failure: JSONArrayError | None = None  # found after a record that was read

    def spans(self) -> Iterator[Span]:
        """The records as spans of lines, in order. Raises JSONArrayError where the array is malformed (the spans
        before it given), cut short, or followed by more than blanks."""
        while self.opened is not None and (self.end is None or self.offset < self.end):
            if self.failure:
                raise self.failure
            if not self.opened:
                yield self._begin()
                continue
            data = self.buffer[self.at : self.at + self.window]
            scan = _scan(data, self.number == 1)
            if scan.taken:
                yield self._take(data, scan)
                self.window, self.run = min(4 * self.window, CHUNK), 1
            elif scan.exact or len(data) > LONGEST_SCAN or not self._more(data):
                for _ in range(self.run):  # at the stream's end too: json says what is missing
                    yield self._exact()
                    if self.failure or not self.opened or (self.end is not None and self.offset >= self.end):
                        break
                self.window, self.run = EXACT_WINDOW, min(2 * self.run, 1024) if scan.exact else 1
        while self.opened is None and (self.end is None or self.offset < self.end) and self._left():
            rest = self.buffer[self.at :][: None if self.end is None else self.end - self.offset]
            if text := rest.lstrip(BLANKS):
                where = self.offset + len(rest) - len(text)
                raise JSONArrayError(f"more than blanks after the array's end, at byte {where}")
            self._advance(len(rest), 0, closed=True)

    def _begin(self) -> Span:
        """The file's start to its `[` (blanks, a byte order mark), as spaces."""
        while not (head := self.buffer.removeprefix(codecs.BOM_UTF8).lstrip(BLANKS)) and self._read():
            pass
        if head[:1] != b"[":
            raise JSONArrayError("the file does not open with '['")
        taken = len(self.buffer) - len(head) + 1
        span = Span(self.offset, np.zeros(0, np.int64), self.number, made=lambda: b" " * taken)
        self._advance(taken, 0, closed=False)
        return span

    def _take(self, data: bytes, scan: Scan) -> Span:
        ends, taken = scan.ends, scan.taken
        if self.end is not None and self.offset + taken > self.end:
            ends = ends[: np.searchsorted(ends, self.end - self.offset - 1) + 1]
            if not len(ends) or self.offset + ends[-1] + 1 != self.end:
                raise JSONArrayError(self._not_between())
            taken = int(ends[-1]) + 1
        closed = scan.closed and taken == scan.taken
        span = Span(self.offset, ends, self.number, closed, partial(_lines, data, taken, scan, ends, closed))
        self._advance(taken, len(ends), closed)
        return span

    def _exact(self) -> Span:
        """The record at the data's start, parsed by json from a window of the data, grown (and the data read on)
        until the record and the comma or `]` after it are in it; raises where the array is malformed there."""
        window = EXACT_WINDOW
        while True:
            data = self.buffer[self.at : self.at + window]
            text = data.decode("utf-8", "surrogateescape")
            unended = len(data) == window or not self.ended  # more may follow what json was given
            start = BLANK.match(text).end()
            try:
                end, valid = _value_end(text, start)
            except json.JSONDecodeError as e:
                # A record cut by the window's end reads as malformed near that end (or as an unterminated string)
                if unended and (e.pos >= len(text) - 8 or e.msg.startswith("Unterminated string")):
                    window = self._grow(window)
                    continue
                if span := self._placed():  # a record the scan places is a line, whichever met it first
                    return span
                at = "" if e.msg.endswith(" at") else " at"  # json's "Unterminated string starting at"
                raise JSONArrayError(f"record {self.number}: {e.msg}{at} byte {self._byte(text, e.pos)}") from None
            after = BLANK.match(text, end).end()
            if unended and after >= len(text) - 8:  # a value at the window's end may go on (`1.` of `1.5`)
                window = self._grow(window)
                continue
            following = text[after : after + 1]
            lead, record = self._byte(text, start) - self.offset, text[start:end].encode("utf-8", "surrogateescape")
            taken = self._byte(text, after) - self.offset + 1
            if following not in (",", "]"):  # the record is read; the array is not read on
                found = f"found {following!r}" if following else "the file ends"
                expected = f"after record {self.number}, at byte {self.offset + taken - 1}: expected ',' or ']'"
                self.failure = JSONArrayError(f"{expected}, {found}")
            elif self.end is not None and self.offset + taken > self.end:
                raise JSONArrayError(self._not_between())
            trail = taken - 1 - lead - len(record)
            lines = b" " * lead + record.translate(SPACES if valid else CARRIAGE_RETURNS) + b" " * trail + b"\n"
            span = Span(self.offset, np.array([taken - 1]), self.number, following == "]", lambda lines=lines: lines)
            self._advance(taken, 1, closed=following == "]")
            return span

    def _placed(self) -> Span | None:
        """The records from the data's start that the scan places (read on as it needs), or None where it places
        none: json parses some records the scan would place (those after one it could not, `run`), and one that is
        not JSON must be a reject (its line) whichever parser meets it, wherever the reading started."""
        while True:
            data = self.buffer[self.at :]
            scan = _scan(data, self.number == 1)
            if scan.taken:
                return self._take(data, scan)
            if scan.exact or len(data) > LONGEST_SCAN or not self._read():
                return None

    def _advance(self, taken: int, records: int, closed: bool) -> None:
        self.at, self.offset, self.number = self.at + taken, self.offset + taken, self.number + records
        self.opened = None if closed else True

    def _left(self) -> bool:
        """Whether data is left to take (read on where none is)."""
        return self.at < len(self.buffer) or self._read()

    def _more(self, data: bytes) -> bool:
        """Whether there is more than `data` to scan: the scan's window widened, or the stream read on."""
        if self.at + len(data) < len(self.buffer):
            self.window *= 4
            return True
        return self._read()

    def _read(self) -> bool:
        """Read on (as much again as is held, so a long record is scanned a few times, not once a chunk); False at
        the stream's end."""
        if self.ended:
            return False
        held = self.buffer[self.at :]
        chunk = self.f.read(max(CHUNK, len(held)))
        self.buffer, self.at, self.ended = held + chunk, 0, not chunk
        self.window = max(self.window, len(self.buffer))
        return bool(chunk)

    def _grow(self, window: int) -> int:
        if self.at + window >= len(self.buffer):
            self._read()
        return 4 * window

    def _byte(self, text: str, position: int) -> int:
        return self.offset + len(text[:position].encode("utf-8", "surrogateescape"))

    def _not_between(self) -> str:
        return f"byte {self.end}, where this piece of the file ends, is not between two records: has the file changed?"


SPACES = bytes.maketrans(b"\r\n", b"  ")  # between a valid record's tokens: blanks, as spaces are
CARRIAGE_RETURNS = bytes.maketrans(b"\n", b"\r")


@dataclass
class Scan:
    taken: int  # the bytes of the whole records found, from the data's start (0: none)
    ends: np.ndarray  # each one's line end: the comma after it, or the array's `]`
    closed: bool  # the last one ends the array
    exact: bool  # the record after them is json's to parse (else: read on)
    quotes: np.ndarray  # the quotes that open or close strings
    breaks: np.ndarray | None  # the line breaks and carriage returns, where one is in a string (not JSON); else None


def _scan(data: bytes, first: bool) -> Scan:
    """The whole records at the start of the data (a record's start, the array's `first` or not) that are `{...}`
    or `[...]` between blanks and commas; and whether the one after them is json's to parse."""
    a = np.frombuffer(data, np.uint8)
    quotes = np.concatenate([start + np.flatnonzero(part == QUOTE) for start, part in scan_parts(a)] or [a[:0]])
    quotes = _unescaped(a, quotes.astype(np.int64))
    found, breaks = _outside_strings(data, a, quotes)
    step = STEP[a[found]].astype(np.int64)
    after = np.cumsum(step) + 1  # the depth after each: the array's records at 1
    before = after - step
    level = np.minimum(before, after) <= 1  # the array's own: its records' brackets, its commas and its `]`
    at, before, step = found[level], before[level], step[level]
    kinds = np.select(
        [(before == 1) & (step == 1), (before == 2) & (step == -1), (before == 1) & (step == 0), before == 1],
        [OPEN, CLOSE, SEPARATOR, END],
        OTHER,
    )
    if first and len(kinds) and kinds[0] == END and _blank(a, np.r_[0], at[:1])[0]:  # `[]`
        return Scan(int(at[0]) + 1, at[:0], True, False, quotes, breaks)
    expected = np.resize(np.array([OPEN, CLOSE, SEPARATOR], kinds.dtype), len(kinds))
    wrong = np.flatnonzero(kinds != expected)
    m = int(wrong[0]) if len(wrong) else len(kinds)
    closed = m < len(kinds) and m % 3 == 2 and kinds[m] == END
    records = m // 3 + closed
    opens, closes, ends = at[0 : 3 * records : 3], at[1 : 3 * records : 3], at[2 : 3 * records + 2 : 3][:records]
    # Before a record's `{` (from the comma before it) and after its `}` (to the comma or `]` after it): blanks only
    bad = np.flatnonzero(~(_blank(a, np.r_[0, ends[:-1] + 1][:records], opens) & _blank(a, closes + 1, ends)))
    if len(bad):
        records, closed = int(bad[0]), False
        ends = ends[:records]
    exact = bool(len(bad)) or (m < len(kinds) and not closed)  # else the data ends in a record: read on
    return Scan(int(ends[-1]) + 1 if records else 0, ends, closed, exact, quotes, breaks)


def _unescaped(a: np.ndarray, quotes: np.ndarray) -> np.ndarray:
    """The quotes not escaped: not after a run of backslashes of odd length (the data starts outside a string, so
    no run crosses its start)."""
    escaped, back = np.zeros(len(quotes), bool), 1
    run = quotes[(quotes >= 1) & (a[quotes - 1] == BACKSLASH)]  # the quotes with a run of `back` backslashes so far
    while len(run):
        escaped[np.searchsorted(quotes, run)] ^= True
        back += 1
        run = run[(run >= back) & (a[run - back] == BACKSLASH)]
    return quotes[~escaped]


def _outside_strings(data: bytes, a: np.ndarray, quotes: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Where the brackets and commas outside strings are; and where the line breaks and carriage returns are, if one
    is in a string (not JSON), else None. A corpus's records are mostly their text, one string: the bytes outside
    strings (keys, punctuation, blanks) are gathered and looked at, where they are few."""
    opening, closing = quotes[0::2], quotes[1::2]  # an odd count: the data ends in a string
    lo = np.r_[0, closing + 1]
    hi = np.r_[opening, len(a)][: len(lo)]
    lengths = hi - lo
    total = int(lengths.sum())
    controls = sum(np.count_nonzero(part < 0x0E) for _, part in scan_parts(a))  # line breaks, tabs: not in strings
    if total <= len(a) // 4:
        outside = np.arange(total) + np.repeat(lo - (np.cumsum(lengths) - lengths), lengths)
        chars = a[outside]
        if np.count_nonzero(chars < 0x0E) == controls:
            return outside[IS_STRUCTURAL[chars]], None
    found = np.flatnonzero(np.frombuffer(data.translate(STRUCTURAL), bool))  # a pass over the data
    found = found[(np.searchsorted(quotes, found) & 1) == 0]
    if not controls:
        return found, None
    positions = np.flatnonzero((a == NEWLINE) | (a == CARRIAGE_RETURN))
    return found, (positions if (np.searchsorted(quotes, positions) & 1).any() else None)


def _blank(a: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether each of a's ranges [lo, hi) holds blanks only: the short ones (most: a comma, a line break and an
    indent) gathered at once."""
    width = 16
    ok = np.ones(len(lo), bool)
    short = hi - lo <= width
    if short.any():
        offsets = np.arange(width)
        index = np.minimum(lo[short, None] + offsets, len(a) - 1)
        ok[short] = (IS_BLANK[a[index]] | (offsets >= (hi - lo)[short, None])).all(axis=1)
    for k in np.flatnonzero(~short):
        ok[k] = IS_BLANK[a[lo[k] : hi[k]]].all()
    return ok


def _lines(data: bytes, taken: int, scan: Scan, ends: np.ndarray, closed: bool) -> bytearray:
    """Bytes [0, taken) of the data as lines: each record's end a line break, the line breaks outside strings
    spaces, a line break inside a string (not JSON) a carriage return, which the JSONL parsers refuse as they
    would the break; an empty array's `]` a space."""
    lines = bytearray(memoryview(data)[:taken])
    if scan.breaks is None:  # every one outside strings
        lines = lines.translate(BLANK_BREAKS) if b"\n" in lines or b"\r" in lines else lines
        out = np.frombuffer(lines, np.uint8)
    else:
        out = np.frombuffer(lines, np.uint8)
        breaks = scan.breaks[scan.breaks < taken]
        inside = (np.searchsorted(scan.quotes, breaks) & 1) == 1
        out[breaks[~inside]] = SPACE
        out[breaks[inside & (out[breaks] == NEWLINE)]] = CARRIAGE_RETURN
    out[ends] = NEWLINE
    if closed and not len(ends):
        out[taken - 1] = SPACE
    return lines


def _value_end(text: str, at: int) -> tuple[int, bool]:
    try:
        return STRICT.raw_decode(text, at)[1], True
    except json.JSONDecodeError as e:
        if not e.msg.startswith("Invalid control character"):
            raise
        return LENIENT.raw_decode(text, at)[1], False


class ArrayStream(io.RawIOBase):
    """The lines of a JSON array file's records (`ArrayRecords`) as a readable binary stream whose positions are
    the file's offsets: from its start, or from a record's start (`offset`, record `number`), where the stream
    starts with the line break that stands for the comma before it. It seeks forward, reading on. Where the array
    is malformed the stream ends, and `error` says why: raised there, it would take with it the lines a buffered
    read had gathered before it; its reader raises it once it has read to the end (`readers.open_piece`)."""

    def __init__(self, f: BinaryIO, offset: int = 0, end: int | None = None, number: int = 1):
        self.spans = ArrayRecords(f, offset, end, number).spans()
        # the span being read (first the comma before the first record, as its line break), its size, where in it
        self.span, self.size, self.at = Span(offset - 1, np.r_[0], 0, made=lambda: b"\n"), int(offset > 0), 0
        self.position = max(offset - 1, 0)
        self.error: JSONArrayError | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, target: int, whence: int = io.SEEK_SET) -> int:
        target += self.position if whence == io.SEEK_CUR else 0
        if whence == io.SEEK_END or target < self.position:
            raise io.UnsupportedOperation("a JSON array's lines seek forward only")
        while self.position < target and self._fill():
            n = min(target - self.position, self.size - self.at)
            self.at, self.position = self.at + n, self.position + n
        return self.position

    def readinto(self, buffer) -> int:
        if not self._fill():
            return 0
        lines = self.span.lines
        n = min(len(buffer), self.size - self.at)
        buffer[:n] = lines[self.at : self.at + n]
        self.at, self.position = self.at + n, self.position + n
        return n

    def _fill(self) -> bool:
        """Whether there is more to read: the next span taken where this one is passed (its lines are made only
        where they are read: a seek passes over spans whole)."""
        while self.at == self.size:
            try:
                span = next(self.spans, None)
            except JSONArrayError as e:
                self.error, span = e, None
            if span is None:
                return False
            self.span, self.at = span, 0
            self.size = int(span.ends[-1]) + 1 if len(span.ends) else len(span.lines)
        return True


def record_starts(f: BinaryIO, targets: list[int]) -> list[tuple[int, int]]:
    """(offset, number) of the first record starting at or after each target offset (ascending), of the array in
    the uncompressed stream `f` (at the file's start): a pass over the file, to the last target's record. Where the
    array is malformed, those before it: a piece from the last of them is read to there, and says what is wrong."""
    found: list[tuple[int, int]] = []
    try:
        for span in ArrayRecords(f).spans():
            starts = span.offset + span.ends[: len(span.ends) - span.closed] + 1  # the records' after each end
            for i in np.searchsorted(starts, targets[len(found) :]):
                if i == len(starts):
                    break
                found.append((int(starts[i]), span.number + int(i) + 1))
            if len(found) == len(targets):
                break
    except JSONArrayError:
        pass
    return found
