"""Flat token shards as nanoGPT and llm.c read them, both directions.

A file is a header of 256 little-endian int32 (`[0]` magic, `[1]` version, `[2]` token count, the rest
zero) and then the tokens back to back. As llm.c's `dev/data/data_common.py` writes them and its
`llmc/dataloader.h` checks them: magic 20240520, version 1, uint16 tokens (GPT-2 style vocabularies);
magic 20240801, version 7, uint32 tokens for larger vocabularies (its "llama-3" variant).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenmill.core import layout
from tokenmill.formats.table import SplitFound

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
VARIANTS = {  # token dtype -> (magic, version)
    np.dtype(np.uint16): (20240520, 1),
    np.dtype(np.uint32): (20240801, 7),
}
MAX_TOKENS = 2**31 - 1  # the count is an int32


class CorruptLlmcFile(ValueError):
    """A file that is not a valid llm.c token shard (message names the file)."""


def llmc_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits in it, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def write_llmc(path: str | Path, tokens: np.ndarray, dtype: np.dtype) -> None:
    """Write `tokens` as one llm.c shard of `dtype` (uint16 or uint32)."""
    dtype = np.dtype(dtype)
    if dtype not in VARIANTS:
        raise ValueError(f"llm.c shards hold uint16 or uint32 tokens, not {dtype}")
    if len(tokens) > MAX_TOKENS:
        raise ValueError(f"{len(tokens)} tokens do not fit one llm.c shard (at most {MAX_TOKENS})")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1] = VARIANTS[dtype]
    header[2] = len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens).astype(dtype.newbyteorder("<"), copy=False).tobytes())


def shard_bounds(n_tokens: int, max_tokens: int) -> list[tuple[int, int]]:
    """[start, end) of each file when `n_tokens` are cut into files of at most `max_tokens`."""
    return [(start, min(start + max_tokens, n_tokens)) for start in range(0, n_tokens, max_tokens)]


class LlmcReader:
    """The tokens of one llm.c shard, memory-mapped, after checking its header against its size."""

    def __init__(self, path: str | Path, *, name: str | None = None):
        """`name` is how errors refer to the file (default its path)."""
        name = name or str(path)
        size = Path(path).stat().st_size
        if size < HEADER_BYTES:
            raise CorruptLlmcFile(f"{name}: {size} bytes, shorter than the {HEADER_BYTES}-byte header")
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
        magic, version, count = (int(v) for v in header[:3])
        variant = {mv: dtype for dtype, mv in VARIANTS.items()}.get((magic, version))
        if variant is None:
            raise CorruptLlmcFile(f"{name}: magic {magic} version {version} is not an llm.c token shard")
        if size != HEADER_BYTES + count * variant.itemsize:
            raise CorruptLlmcFile(f"{name}: {size} bytes, the header promises {count} {variant} tokens")
        self.dtype = variant
        dtype = variant.newbyteorder("<")
        self.tokens = (
            np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,)) if count else np.zeros(0, dtype)
        )

    def __len__(self) -> int:
        return len(self.tokens)


def split_files(row, run) -> list[str]:
    """A shard's split's files (`formats.table`): as many parts as its tokens need at `output.llmc_shard_tokens`,
    or as its stats count where they count more (a split without tokens whose stats count files is checked too)."""
    parts = max(len(shard_bounds(row.tokens, run.llmc_shard_tokens)), row.llmc_files)
    return [layout.llmc_file(row.split, row.shard_id, part) for part in range(parts)]


def check(found: SplitFound) -> list[str]:
    """The parts the stats count against those the split's tokens need, then each part's header, dtype and size,
    and the split's tokens in all."""
    row, cap, dtype = found.row, found.run.llmc_shard_tokens, llmc_dtype(found.run.vocab_size)
    first = layout.llmc_file(row.split, row.shard_id, 0)
    if row.llmc_files != (needed := len(shard_bounds(row.tokens, cap))):
        return [f"{first}: stats say {row.llmc_files} llm.c files, {row.tokens} tokens need {needed}"]
    tokens = 0
    for rel, path in zip(found.rels, found.paths, strict=True):
        try:
            shard = LlmcReader(path, name=rel)
        except CorruptLlmcFile as e:
            return [str(e)]
        if shard.dtype != dtype or len(shard) > cap:
            return [f"{rel}: {len(shard)} {shard.dtype} tokens, expected {dtype} and at most {cap}"]
        tokens += len(shard)
    if tokens != row.tokens:
        return [f"{first}: the llm.c files hold {tokens} tokens, stats say {row.tokens}"]
    return []
