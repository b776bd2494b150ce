"""The partition stage: a deterministic plan of shards of about `shard_size` uncompressed bytes.

Uncompressed JSONL files larger than a shard are cut at newline-aligned byte offsets, found by seeking; a `.json`
file that holds one JSON array at its records' starts, found by a pass over it (`arrays.record_starts`, which
numbers them too); plain text files split by `input.separator` lines just after such a line. The line number at
each cut is counted here (a pass over the whole file) only where a document id `<file>:<line>` is hashed while the
shards run (`counts_lines`); elsewhere a piece's first line is left unknown, and the rejects of a piece after the
first are numbered once its file's earlier pieces are read (`tokenize.number_lines`); a text document's id is its
first line, so a text file's are always counted. Parquet and Arrow files are cut by runs of their groups of rows (row
groups, record batches; an Arrow file only where it is local: its batches are measured by passing over its memory
map); compressed streams and a text file that is one document are taken whole; small files are grouped, where a hash
of each file's name decides the group ends (see `_ends_group`).

The shards are a function of the input set and the shard size alone, numbered in input order: the same
files give the same shards with the same ids however the input grew. A file that lands or goes changes
its own group, not the ones after it.

In a mixture each source's files are cut on their own, source after source in config order (a shard holds one
source's files, and names it: `mix_source`), the ids numbered across them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import struct
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import fsspec
import orjson
import zstandard

from tokenmill.config import InputConfig, TokenmillConfig
from tokenmill.core import layout
from tokenmill.core.commits import discard, land, lift
from tokenmill.core.hashing import unit_interval
from tokenmill.core.plan import Plan, Shard, Shards
from tokenmill.core.signing import signed, write_signed
from tokenmill.formats.table import FORMATS
from tokenmill.io.arrays import may_hold_array, opens_array, record_starts
from tokenmill.io.names import compression_of, format_of
from tokenmill.io.readers import (
    LINE_PROBE,
    TABLES,
    Piece,
    ReadOptions,
    count_newlines,
    fast_path_applies,
    groups_of,
    holds_array,
    kind_of,
    line_start,
    separated_start,
    separated_text,
)
from tokenmill.io.storage import JSON_OPTIONS, list_files, options_for

# The line count reads into one buffer of this size, reused: 16 MB reads were each a fresh allocation, paged in
# anew (40% slower over a 1.2 GB file).
SCAN_CHUNK = 256 << 10
# shard_size: auto. Eight shards per cluster thread balance the load (a thread's last shard ends near the
# others'); 16 MB keeps a shard's fixed costs (files, markers, a Dask task) small beside its work; 1 GB keeps a
# 100 TB corpus at about 100,000 shards, where a retried shard costs seconds, not minutes.
SHARDS_PER_THREAD, MIN_AUTO_SHARD, MAX_AUTO_SHARD = 8, 16_000_000, 1_000_000_000
LOOSE_FILES = 64  # at most this many small files at the end of a run stand alone (see `_group`)
RATIO_GUESS = 4  # where a compressed file does not record its size (xz's index is not read; bz2 has none)


def uncompressed_size(url: str, size: int, storage_options: dict) -> int:
    """The uncompressed size of the file of `size` bytes (as listed): exact for plain files, from the trailer, header
    or footer otherwise."""
    codec = compression_of(url)
    if codec is None and format_of(url) != "parquet":  # a source tree's 100,000 files: no look at each
        return size
    fs, path = fsspec.core.url_to_fs(url, **options_for(url, storage_options))
    if format_of(url) == "parquet":
        return sum(size for _, size in groups_of(Piece(url), ReadOptions(storage_options=storage_options)))
    if codec == "gzip" and size >= 18:
        with fs.open(path, "rb") as f:
            f.seek(size - 4)
            isize = struct.unpack("<I", f.read(4))[0]  # the size mod 2**32: a lower bound past 4 GiB
        return max(isize, size)
    if codec == "zstd":
        with fs.open(path, "rb", block_size=LINE_PROBE) as f:  # not a block ahead (s3fs: 50 MB) for 18 bytes
            content = zstandard.get_frame_parameters(f.read(18)).content_size
        return content if content > 0 else size * RATIO_GUESS
    return size * RATIO_GUESS if codec else size


def counts_lines(config: TokenmillConfig, source_input: InputConfig) -> bool:
    """Whether the partition counts the lines before each cut of the source's files: where the shards hash the ids
    `<file>:<line>` (several splits and no id field to take them from; the global shuffle routes documents by
    them), where the careful reader, which numbers lines as it goes and reports no count, reads the files
    (fields at dotted paths), or where a format of `output.formats` writes each document's line into its files
    (OLMo's `.csv.gz`: the pack stage writes it as each shard is tokenized, before the pieces before it are read)."""
    hashed = (len(config.split) > 1 and source_input.id_field is None) or config.partition.shuffle
    in_files = any(FORMATS[name].numbers_lines for name in config.output.formats)
    return hashed or in_files or not fast_path_applies(Piece("any.jsonl"), source_input.read_options())


def cut_points(
    url: str, size: int, n_pieces: int, storage_options: dict, count_lines: bool = True, separator: str | None = None
) -> list[tuple[int, int | None]]:
    """(byte offset, line number) of the first line at or after each of n_pieces - 1 even cuts (`cut_offsets`). The
    cuts are found by seeking; with `count_lines` the line endings before each are counted a range per thread (file
    reads and numpy release the GIL): a pass over the whole file, on every core. Without, the line numbers are None."""
    fs, path = fsspec.core.url_to_fs(url, **options_for(url, storage_options))
    offsets = cut_offsets(url, size, n_pieces, storage_options, separator)
    if not offsets or not count_lines:
        return [(offset, None) for offset in offsets]
    starts = [0, *offsets[:-1]]
    with ThreadPoolExecutor(min(len(offsets), os.cpu_count() or 1)) as pool:
        counts = pool.map(lambda start, end: _newlines(fs, path, start, end), starts, offsets)
        return [(offset, lines + 1) for offset, lines in zip(offsets, itertools.accumulate(counts), strict=True)]


def cut_offsets(url: str, size: int, n_pieces: int, storage_options: dict, separator: str | None = None) -> list[int]:
    """The byte offsets of the first line at or after each of n_pieces - 1 even cuts, found by seeking (a read of a
    line or so at each). None in a file of one JSON array (an empty list): its records are found by parsing. With a
    `separator` (plain text), the first line after a separator line past each cut: a document's first line."""
    fs, path = fsspec.core.url_to_fs(url, **options_for(url, storage_options))
    targets = [size * k // n_pieces for k in range(1, n_pieces)]
    # Blocks of a probe's size: an object store's file reads a block ahead of each read (s3fs: 50 MB at every cut)
    with fs.open(path, "rb", block_size=LINE_PROBE) as f:
        if separator is not None:
            return sorted({separated_start(f, target, separator.encode()) for target in targets} - {size})
        if may_hold_array(url) and opens_array(f):
            return []
        return sorted({line_start(f, target) for target in targets} - {size})


def _newlines(fs, path: str, start: int, end: int) -> int:
    """The line endings in bytes [start, end) of the file."""
    count, buffer = 0, memoryview(bytearray(SCAN_CHUNK))
    with fs.open(path, "rb") as f:
        f.seek(start)
        while start < end and (read := f.readinto(buffer[: min(SCAN_CHUNK, end - start)])):
            count += count_newlines(buffer[:read])
            start += read
    return count


def group_pieces(url: str, shard_size: int, options: ReadOptions) -> list[tuple[Piece, int]] | None:
    """A Parquet or Arrow file's pieces (with their sizes): runs of consecutive groups of rows (`readers.groups_of`) of
    about shard_size bytes, and a group of about two ranges or more cut into ranges of its rows: of about shard_size
    in an Arrow file (a piece passes over the rows before its first in the memory map), of a thread's share of an
    auto-sized run in a Parquet file (SHARDS_PER_THREAD shards: a piece decodes its group's pages before its first row,
    so smaller ranges cost more decoding than they balance). None where the groups' sizes are not known."""
    if (groups := groups_of(Piece(url), options)) is None:
        return None
    part = shard_size * (SHARDS_PER_THREAD if kind_of(Piece(url), options) == "parquet" else 1)
    pieces, run, run_bytes = [], [], 0
    for g, (rows, size) in enumerate(groups):
        if (parts := min(rows, round(size / part))) >= 2:
            if run:
                pieces.append((Piece(url, row_groups=run), run_bytes))
                run, run_bytes = [], 0
            bounds = [rows * k // parts for k in range(parts + 1)]
            for lo, hi in itertools.pairwise(bounds):
                end = None if hi == rows else hi
                pieces.append((Piece(url, lo, end, row_groups=[g]), size * (hi - lo) // rows))
            continue
        run.append(g)
        run_bytes += size
        if run_bytes >= shard_size:
            pieces.append((Piece(url, row_groups=run), run_bytes))
            run, run_bytes = [], 0
    return pieces + [(Piece(url, row_groups=run), run_bytes)] if run else pieces


def _split_large_file(
    url: str, size: int, shard_size: int, options: ReadOptions, count_lines: bool
) -> list[tuple[Piece, int]] | None:
    """The pieces (with their sizes) of a file larger than a shard, or None if it cannot be split: a text file that is
    one document, compressed text, an Arrow file whose batches' sizes are not known (`group_pieces`), a compressed
    JSONL stream under a thread's share or whose lines must be counted (`compressed_pieces`)."""
    kind, storage_options = kind_of(Piece(url), options), options.storage_options
    if kind in TABLES:
        return group_pieces(url, shard_size, options)
    if kind == "jsonl" and compression_of(url) is not None and not may_hold_array(url) and not count_lines:
        return compressed_pieces(url, size, shard_size)
    if kind == "jsonl" and compression_of(url) is None and holds_array(Piece(url), options):
        return array_pieces(url, size, shard_size, storage_options)
    separated = separated_text(Piece(url), options)
    if (kind == "jsonl" or separated) and compression_of(url) is None:
        separator = options.separator if separated else None
        # A text document's id is the line it starts on: counted whatever the run hashes
        cuts = cut_points(url, size, math.ceil(size / shard_size), storage_options, count_lines or separated, separator)
        if not cuts:  # one line, one JSON array, or no separator line after the first cut
            return None
        starts = [(0, 1), *cuts]
        ends = [c[0] for c in cuts] + [size]
        return [(Piece(url, s, e, line), e - s) for (s, line), e in zip(starts, ends, strict=True)]
    return None


def array_pieces(url: str, size: int, shard_size: int, storage_options: dict) -> list[tuple[Piece, int]] | None:
    """A file of one JSON array (uncompressed) cut at the first record starting at or after each of its even cuts,
    each piece numbered by its first record (`arrays.record_starts`: a pass over the file, on one core; where the
    array is malformed, the last piece runs from the last record before it and says what is wrong). None where no
    record starts after the first cut."""
    fs, path = fsspec.core.url_to_fs(url, **options_for(url, storage_options))
    n_pieces = math.ceil(size / shard_size)
    with fs.open(path, "rb") as f:
        cuts = sorted(set(record_starts(f, [size * k // n_pieces for k in range(1, n_pieces)])))
    if not cuts:
        return None
    starts, ends = [(0, 1), *cuts], [start for start, _ in cuts] + [size]
    return [(Piece(url, s, e, number), e - s) for (s, number), e in zip(starts, ends, strict=True)]


def _records_cut(url: str, pieces: list[tuple[Piece, int]], storage_options: dict) -> bool:
    """Whether an earlier plan's pieces of a JSON array file start at records (after a comma), as `array_pieces` cuts
    them; an earlier tokenmill, which read arrays as lines, cut them at line starts."""
    fs, path = fsspec.core.url_to_fs(url, **options_for(url, storage_options))
    with fs.open(path, "rb", block_size=LINE_PROBE) as f:
        for piece, _ in pieces[1:]:
            f.seek(piece.start - 1)
            if f.read(1) != b",":
                return False
    return True


def compressed_pieces(url: str, size: int, shard_size: int) -> list[tuple[Piece, int]] | None:
    """A compressed JSONL stream of about two threads' shares of an auto-sized run or more (SHARDS_PER_THREAD shards
    each), cut into ranges of about one share of its decompressed bytes (`size`, as `uncompressed_size` knows it), each
    holding the lines that start in it (`readers.first_line_at`: the cuts are not at line starts, which would take a
    pass over the stream to find) and numbered once the pieces before it are read (`tokenize.number_lines`). A piece
    decompresses the stream up to its start and drops it: smaller ranges would cost more than they balance. The last
    piece runs to the stream's end, however far that is from the size guessed. Else None (read whole)."""
    parts = round(size / (shard_size * SHARDS_PER_THREAD))
    if parts < 2:
        return None
    bounds = [size * k // parts for k in range(parts)] + [None]
    return [
        (Piece(url, start, end, 1 if start == 0 else None), (end or size) - start)
        for start, end in itertools.pairwise(bounds)
    ]


def auto_shard_size(total_bytes: int, cluster_threads: int) -> int:
    """`shard_size: auto`: the corpus over SHARDS_PER_THREAD shards per thread, within the bounds."""
    return min(max(-(-total_bytes // max(1, SHARDS_PER_THREAD * cluster_threads)), MIN_AUTO_SHARD), MAX_AUTO_SHARD)


def plan_shards(
    config: TokenmillConfig,
    cluster_threads: int = 1,
    shard_size: int | None = None,
    earlier: Plan | None = None,
    own: bool = False,
) -> Plan:
    """The plan: every input file as it is now (with its fingerprint), and the shards in input order, each a
    list of pieces with its size and `source` (a hash of its pieces and their files' fingerprints: what its
    output is made from). `shard_size` overrides the config's (an earlier plan's resolved `auto`).

    `earlier` (a plan of the same input and partition config over an input that has changed since) saves
    reading: an unchanged file's uncompressed size and cut points are taken from it; its cuts are found again by
    seeking (`_checked_cuts`) unless it is `own`: signed with this user's key (`signing`), written by their run."""
    files = list_inputs(config)
    known = {f["path"]: f for f in earlier.files} if earlier else {}
    options_of = {name: source_input.read_options() for name, source_input in config.inputs().items()}
    for f in files:  # an unchanged file's uncompressed size is known (measuring it reads the file's end)
        before = known.get(f["path"])
        storage = options_of[f.get("mix_source", "")].storage_options
        known_size = before and _fingerprint(before) == f
        f["bytes"] = before["bytes"] if known_size else uncompressed_size(f["path"], f["size"], storage)
    total = sum(f["bytes"] for f in files)
    if shard_size is None:
        configured = config.partition.shard_size
        shard_size = auto_shard_size(total, cluster_threads) if configured == "auto" else int(configured)
    current = {f["path"]: f for f in files}
    unchanged = {path for path, f in current.items() if known.get(path) == f}
    cuts = _cuts_of(earlier, unchanged) if earlier and earlier.shard_size == shard_size else {}
    shards = []
    for name, options in options_of.items():  # a source's shards hold its files only
        of_source = [f for f in files if f.get("mix_source", "") == name]
        count_lines = counts_lines(config, config.inputs()[name])
        for pieces, nbytes in _cut_into_shards(of_source, shard_size, options, count_lines, cuts, own):
            shards.append(Shard(len(shards), tuple(pieces), nbytes, _source_of(pieces, current), name))
    check_covers(files, shards)
    inputs = inputs_hash(files)
    return Plan(
        key=plan_key(config, inputs),
        config_key=config.section_hash("input", "partition"),
        inputs=inputs,
        shard_size=shard_size,
        shuffled_shards=math.ceil(total / shard_size) if config.partition.shuffle else None,
        files=files,
        shards=Shards(shards),
    )


def check_covers(files: list[dict], shards: list[Shard]) -> None:
    """Every byte (or row) of every input file in exactly one shard's pieces, so every document is in exactly one
    shard: a file whole in one piece, or cut into byte ranges that follow one another from its start to its end, or
    into runs of groups of rows and ranges of a group's rows that together take each row once. Raises naming the file
    otherwise."""
    pieces: dict[str, list[Piece]] = {f["path"]: [] for f in files}
    for shard in shards:
        for piece in shard.pieces:
            if piece.path not in pieces:
                raise RuntimeError(f"the plan's shard {shard.shard_id:05d} reads {piece.path}, no input file")
            pieces[piece.path].append(piece)
    for f in files:
        of_file = pieces[f["path"]]
        if len(of_file) == 1 and of_file[0].whole:
            continue
        # by where each starts (an end is None at a file's or group's end)
        groups = sorted(((g, p.start, p.end) for p in of_file for g in p.row_groups or ()), key=lambda r: r[:2])
        ranges = sorted(((piece.start, piece.end) for piece in of_file), key=lambda r: r[0])
        if not of_file:
            whole = False
        elif all(piece.row_groups for piece in of_file):
            whole = _takes_every_row(groups)
        else:
            ends = [end for _, end in ranges]
            whole = ranges[0][0] == 0 and ends[-1] in (None, f["bytes"]) and ends[:-1] == [s for s, _ in ranges[1:]]
        if not whole:
            raise RuntimeError(
                f"the plan reads {f['path']} in pieces that do not take each of its documents once "
                f"({ranges if not groups else groups}): a tokenmill bug; nothing was run"
            )


def list_inputs(config: TokenmillConfig) -> list[dict]:
    """Every input file as it is now (`list_files`), source by source; in a mixture each names its source
    (`mix_source`), which is then part of its fingerprint: a file is read as its source's, into its outputs."""
    files: list[dict] = []
    for name, source_input in config.inputs().items():
        try:
            found = list_files(source_input.paths, source_input.storage.fsspec_options())
        except FileNotFoundError as e:
            if not name:
                raise
            raise FileNotFoundError(f"source {name!r}: {e}") from None
        files += [f | {"mix_source": name} for f in found] if name else found
    paths = [f["path"] for f in files]
    if len(set(paths)) < len(paths):
        twice = sorted({f"{f['path']} ({f['mix_source']})" for f in files if paths.count(f["path"]) > 1})
        raise ValueError(f"an input file may belong to one source only: {', '.join(twice[:5])}")
    return files


def change_between(earlier: Plan, plan: Plan) -> dict:
    """The input files added, changed and removed since the earlier plan, and how many shards are the earlier
    plan's under the same id, under another id (a file landed or went before them in input order), or new."""
    known, current = {f["path"]: f for f in earlier.files}, {f["path"]: f for f in plan.files}
    ids_before = {s.source: s.shard_id for s in earlier.shards}
    kept = sum(ids_before.get(s.source) == s.shard_id for s in plan.shards)
    new = sum(s.source not in ids_before for s in plan.shards)
    return {
        "files_added": len(current.keys() - known.keys()),
        "files_changed": sum(known[p] != current[p] for p in current.keys() & known.keys()),
        "files_removed": len(known.keys() - current.keys()),
        "shards_kept": kept,
        "shards_renumbered": len(plan.shards) - kept - new,
        "shards_new": new,
    }


def _takes_every_row(groups: list[tuple[int, int, int | None]]) -> bool:
    """Whether a table file's pieces, as (group, first row, end row) of each group each takes (sorted), take every
    group 0, 1, ... once: whole (0, None), or in ranges of its rows that follow one another from 0 to its end."""
    numbers = []
    for g, parts in itertools.groupby(groups, key=lambda part: part[0]):
        starts, ends = zip(*((start, end) for _, start, end in parts), strict=True)
        if starts[0] != 0 or ends[-1] is not None or list(ends[:-1]) != list(starts[1:]):
            return False
        numbers.append(g)
    return numbers == list(range(len(numbers)))


def _cuts_of(earlier: Plan, unchanged: set[str]) -> dict[str, list[tuple[Piece, int]]]:
    """The pieces (with their sizes) an earlier plan of the same shard size cut each unchanged large file into (a
    compressed stream's last piece runs to its end: not whole, though its end is None)."""
    cuts: dict[str, list[tuple[Piece, int]]] = {}
    for shard in earlier.shards:
        (piece, *others) = shard.pieces
        if not others and piece.path in unchanged and not piece.whole:
            cuts.setdefault(piece.path, []).append((piece, shard.bytes))
    return cuts


def _cut_into_shards(
    files: list[dict],
    shard_size: int,
    options: ReadOptions,
    count_lines: bool,
    cuts: dict[str, list[tuple[Piece, int]]],
    own: bool = False,
) -> list[tuple[list[Piece], int]]:
    """Files in order, cut into shards of about shard_size: a file larger than a shard into pieces where it can
    be cut (`cuts`: pieces already known; `count_lines`: see `counts_lines`), each alone in its shard, and each run
    of smaller files into groups (see `_group`)."""
    shards: list[tuple[list[Piece], int]] = []
    small: list[tuple[Piece, int]] = []
    for f in files:
        url, size = f["path"], f["bytes"]
        if size <= shard_size:
            small.append((Piece(url, size=f["size"]), size))
            continue
        shards += _group(small, shard_size)
        small = []
        # A file's own cuts are checked where it is read in another format than its name's (an earlier tokenmill cut
        # files by their names) and where it is a .json file (an earlier one read arrays as lines, and cut them so)
        stored = cuts.get(url)
        trusted = own and stored and kind_of(Piece(url), options) == format_of(url)
        if trusted and may_hold_array(url):
            trusted = holds_array(Piece(url), options) and _records_cut(url, stored, options.storage_options)
        known = stored if trusted else _checked_cuts(url, size, shard_size, options, stored)
        pieces = known or _split_large_file(url, size, shard_size, options, count_lines) or [(Piece(url), size)]
        shards += [([piece], nbytes) for piece, nbytes in pieces]
    return shards + _group(small, shard_size)


def _checked_cuts(
    url: str, size: int, shard_size: int, options: ReadOptions, stored: list[tuple[Piece, int]] | None
) -> list[tuple[Piece, int]] | None:
    """An earlier plan's pieces of an unchanged JSONL file if they are the cut this plan makes, found again by seeking
    (a read at each cut), so that only the count of the lines before each cut is saved; else None (cut it again).
    plan.json is data in the output location: pieces cut elsewhere (a planted plan, whose shards would drop or repeat
    documents) are never taken. Parquet and Arrow files are cut again: their groups of rows are measured without
    reading them (`readers.groups_of`)."""
    if not stored or kind_of(Piece(url), options) != "jsonl" or compression_of(url) is not None:
        return None
    offsets = cut_offsets(url, size, math.ceil(size / shard_size), options.storage_options)
    bounds = list(zip([0, *offsets], [*offsets, size], strict=True))
    first, *lines = [piece.first_line for piece, _ in stored]  # the first piece's is 1; the others' counted or None
    counted = all(isinstance(line, int) and line > 1 for line in lines) and lines == sorted(set(lines))
    numbered = first == 1 and (counted or all(line is None for line in lines))
    same = [(piece.path, piece.start, piece.end, piece.row_groups, piece.format) for piece, _ in stored] == [
        (url, start, end, None, None) for start, end in bounds
    ]
    sizes = [nbytes for _, nbytes in stored] == [end - start for start, end in bounds]
    return stored if same and sizes and numbered else None


def _group(files: list[tuple[Piece, int]], shard_size: int) -> list[tuple[list[Piece], int]]:
    """Small files in order, grouped where `_ends_group` says. The files after the last group's end are grouped
    the same way at an eighth of the size, until at most LOOSE_FILES are left: those stand alone, a shard each,
    so a file landing after them (as dated drops do) is a shard of its own rather than a group to redo; they
    are grouped (and redone, once) when a file ends their group."""
    groups: list[tuple[list[Piece], int]] = []
    group: list[tuple[Piece, int]] = []
    group_bytes = 0
    # not the directory: the same files give the same shards wherever they are
    places = unit_interval([piece.path.rsplit("/", 1)[-1] for piece, _ in files], "group:").tolist()
    for (piece, size), place in zip(files, places, strict=True):
        group.append((piece, size))
        group_bytes += size
        if _ends_group(place, size, group_bytes, shard_size):
            groups.append(([p for p, _ in group], group_bytes))
            group, group_bytes = [], 0
    if len(group) <= LOOSE_FILES:
        return groups + [([p], size) for p, size in group]
    return groups + _group(group, shard_size // 8)


def _ends_group(place: float, size: int, group_bytes: int, shard_size: int) -> bool:
    """Whether a small file ends its group: once the group holds half a shard, with a chance of twice its share
    of a shard (so groups average about a shard), decided by a hash of its file name (`place`), not where the
    group began; always at two shards. A file added or removed thus moves the end of its own group alone: the
    groups after it end where they did, and keep their outputs (grouping by filling each shard in turn would
    shift every group after it)."""
    return group_bytes >= 2 * shard_size or (2 * group_bytes >= shard_size and place * shard_size < 2 * size)


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _fingerprint(file: dict) -> dict:
    """A plan's file entry as `list_files` gives it: URL, size and ETag or mtime."""
    return {k: v for k, v in file.items() if k != "bytes"}


def inputs_hash(files: list[dict]) -> str:
    """The input as it is now: its files' URLs and fingerprints."""
    return _digest([_fingerprint(f) for f in files])


def _source_of(pieces: list[Piece], files: dict[str, dict]) -> str:
    """What a shard's output is made from: its pieces and the fingerprints of their files (not its id)."""
    # a piece's size is its file's, which the fingerprint holds: left out, so that sources stay as they were
    return _digest([[{k: v for k, v in p.to_json().items() if k != "size"}, files[p.path]] for p in pieces])


def plan_key(config: TokenmillConfig, inputs: str) -> str:
    """The plan's key: the input and partition config, and the input files as they are now (`inputs_hash`)."""
    return _digest([config.section_hash("input", "partition"), inputs])


@dataclass(frozen=True)
class PlanAhead:
    """A plan being made in a thread before its run's partition stage reaches it (`tokenmill run` starts one while
    it imports Prefect, and hands it to the flow); that stage's `load_or_plan` waits for it."""

    config_key: str  # the input and partition config it is made for
    cluster_threads: int
    made: Future

    @classmethod
    def start(cls, config: TokenmillConfig, cluster_threads: int) -> PlanAhead:
        made: Future = Future()

        def plan() -> None:
            try:
                made.set_result(_load_or_plan(config, cluster_threads))
            except BaseException as e:  # the stage's own call plans again, and fails there
                made.set_exception(e)

        # A daemon: a run that ends early (interrupted, its API unreachable) does not wait for it at exit; a plan
        # cut short is as a killed run's (plan.json is written whole; shards it was moving are redone).
        threading.Thread(target=plan, name="tokenmill-plan", daemon=True).start()
        return cls(config.section_hash("input", "partition"), cluster_threads, made)


def load_or_plan(
    config: TokenmillConfig, cluster_threads: int = 1, ahead: PlanAhead | None = None
) -> tuple[Plan, dict | None]:
    """The plan in the output if the input and partition config are as it recorded them (so a rerun or retry
    of a half-finished run sees the same shards), else a new one written there. Against the earlier plan, by
    `source`: a shard made from the same pieces of the same file versions keeps its committed output (moved to
    its new id if it has one), and the outputs of the shards that are gone are discarded. Returns the plan and
    the change: None for the recorded plan, else what `change_between` says ({} for a first plan). A resolved
    `auto` shard size sticks: a new plan over an output that has one keeps its size, whatever the cluster now.
    A plan made `ahead` for the same config and threads is this call's result, unless it failed (then this call
    plans again, and fails itself)."""
    if ahead is not None:
        made = ahead.made.exception() is None  # waited for: one plan at a time in an output
        if made and (ahead.config_key, ahead.cluster_threads) == (
            config.section_hash("input", "partition"),
            cluster_threads,
        ):
            return ahead.made.result()
    return _load_or_plan(config, cluster_threads)


def _load_or_plan(config: TokenmillConfig, cluster_threads: int) -> tuple[Plan, dict | None]:
    store = config.output.store()
    earlier, own = None, False
    if store.exists(layout.PLAN):
        text = store.read_bytes(layout.PLAN)
        earlier, own = Plan.from_json(orjson.loads(text)), signed(store, layout.PLAN, text)
    sticky = earlier.shard_size if earlier and config.partition.shard_size == "auto" else None
    same_config = earlier is not None and _made_alike(earlier, config)
    plan = plan_shards(config, cluster_threads, sticky, earlier if same_config else None, own)
    # The input as the earlier plan saw it: every shard kept. Its shards as this plan cuts them too: a plan.json
    # planted with the right key and pieces of other files (secrets of whoever reruns) is not read. And signed: what
    # the comparison leaves out (the small files' sizes, which the reader and the sample trust) is never a planter's.
    if own and same_config and plan.key == earlier.key and plan.shards == earlier.shards:
        return earlier, None
    moved = []
    if earlier is not None:
        ids_now = {s.source: s.shard_id for s in plan.shards}
        discard(store, [s.shard_id for s in earlier.shards if s.source not in ids_now])
        moves = {s.shard_id: ids_now[s.source] for s in earlier.shards if s.source in ids_now}
        moved = lift(store, {old: new for old, new in moves.items() if old != new})
    write_signed(store, layout.PLAN, orjson.dumps(plan.to_json(), option=JSON_OPTIONS | orjson.OPT_APPEND_NEWLINE))
    land(store, moved)  # after the plan: a run killed before this finds those shards uncommitted, and redoes them
    return plan, change_between(earlier, plan) if same_config else {}


def _made_alike(earlier: Plan, config: TokenmillConfig) -> bool:
    """Whether an earlier plan was made with this input and partition config, and, where this config needs the
    lines at each cut counted (`counts_lines`), knows every piece's first line."""
    if earlier.config_key != config.section_hash("input", "partition"):
        return False
    if not any(counts_lines(config, source_input) for source_input in config.inputs().values()):
        return True
    return all(piece.first_line is not None for shard in earlier.shards for piece in shard.pieces)
