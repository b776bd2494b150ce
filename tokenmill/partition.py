"""The partition stage: a deterministic plan of shards of about `shard_size` uncompressed bytes.

Uncompressed files larger than a shard are cut at newline-aligned byte offsets (the line number at
each cut is counted here, once, so document ids and error messages can name the line); compressed
files cannot be cut and are taken whole; small files are grouped until a shard is full.
"""

from __future__ import annotations

import math
import struct
from dataclasses import asdict

import fsspec
import zstandard

from tokenmill.config import TokenmillConfig
from tokenmill.readers import Piece, compression_of
from tokenmill.storage import expand_paths

SCAN_CHUNK = 16 << 20
ZSTD_RATIO_GUESS = 4  # when a zstd frame does not record its content size


def uncompressed_size(url: str) -> int:
    """The file's uncompressed size: exact for plain files, from the trailer or header when compressed."""
    fs, path = fsspec.core.url_to_fs(url)
    size = fs.size(path)
    codec = compression_of(url)
    if codec == "gzip" and size >= 18:
        with fs.open(path, "rb") as f:
            f.seek(size - 4)
            isize = struct.unpack("<I", f.read(4))[0]  # the size mod 2**32: a lower bound past 4 GiB
        return max(isize, size)
    if codec == "zstd":
        with fs.open(path, "rb") as f:
            content = zstandard.get_frame_parameters(f.read(18)).content_size
        return content if content > 0 else size * ZSTD_RATIO_GUESS
    return size


def cut_points(url: str, size: int, n_pieces: int) -> list[tuple[int, int]]:
    """(byte offset, line number) of the first line at or after each of n_pieces - 1 even cuts."""
    targets = [size * k // n_pieces for k in range(1, n_pieces)]
    cuts: list[tuple[int, int]] = []
    pos, lines_before = 0, 0
    with fsspec.open(url, "rb") as f:
        while targets and (chunk := f.read(SCAN_CHUNK)):
            while targets:
                nl = chunk.find(b"\n", max(targets[0] - 1 - pos, 0))
                if nl < 0:
                    break
                offset = pos + nl + 1
                cuts.append((offset, lines_before + chunk.count(b"\n", 0, nl + 1) + 1))
                targets = [t for t in targets if t > offset]
            lines_before += chunk.count(b"\n")
            pos += len(chunk)
    return [c for c in cuts if c[0] < size]


def plan_shards(config: TokenmillConfig) -> dict:
    """The plan: every input file, and the ordered shards, each a list of pieces."""
    shard_size = int(config.partition.shard_size)
    files = [(url, uncompressed_size(url)) for url in expand_paths(config.input.paths)]
    shards: list[list[Piece]] = []
    group: list[Piece] = []
    group_bytes = 0
    for url, size in files:
        if size > shard_size and compression_of(url) is None:
            if group:  # keep the shards in input order
                shards.append(group)
                group, group_bytes = [], 0
            cuts = cut_points(url, size, math.ceil(size / shard_size))
            starts = [(0, 1), *cuts]
            ends = [c[0] for c in cuts] + [None]
            shards.extend([Piece(url, s, e, line)] for (s, line), e in zip(starts, ends, strict=True))
            continue
        group.append(Piece(url))
        group_bytes += size
        if group_bytes >= shard_size:
            shards.append(group)
            group, group_bytes = [], 0
    if group:
        shards.append(group)
    sizes = dict(files)
    return {
        "dataset_hash": config.dataset_hash(),
        "files": [{"path": url, "bytes": size} for url, size in files],
        "shards": [
            {
                "shard_id": i,
                "pieces": [asdict(p) for p in pieces],
                "bytes": sum((p.end if p.end is not None else sizes[p.path]) - p.start for p in pieces),
            }
            for i, pieces in enumerate(shards)
        ],
    }


def shard_pieces(shard: dict) -> list[Piece]:
    return [Piece(**p) for p in shard["pieces"]]
