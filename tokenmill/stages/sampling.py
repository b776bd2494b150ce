"""The sample stage: per shard, a deterministic proportional sample for training the tokenizer, and a
disjoint held-out sample for the fertility report, drawn from a bounded part of the corpus.

Each document gets a seeded hash h of its id, uniform in [0, 1). With f = sample_size / corpus bytes and
g = holdout_size / corpus bytes (rounded down to four significant bits, `on_grid`: a corpus that grows by a few
percent keeps its g, and so its shards' committed samples), a document is in the training sample when h < f and
held out when f <= h < f + g: every shard, source and language contributes in proportion, whatever the shard count
or worker, and no document is in both. Sizes are measured like the plan's shards (uncompressed input bytes).

Reading the whole corpus for a sample of a few MB would cost a pass over the corpus, so line-based inputs
(JSONL, plain or compressed, and the global shuffle's files) are read in blocks: each file is cut into
blocks of `SAMPLE_BLOCK_BYTES` at fixed offsets, a document belongs to the block its line starts in, and the
sample reads one block in every `stride` of each file (at a seeded phase per file), parsed by the columnar
reader, where the thresholds above scale by `stride`: h < f * stride, f * stride <= h < (f + g) * stride.
Each document is still in the training sample with probability f and held out with probability g, and the
blocks do not depend on how the file is cut into shards, so the sample does not either. `stride` is chosen
so that the blocks read hold `OVERSAMPLE` times the sample's bytes (a quarter of each block's documents is
taken: runs of neighbouring documents stay short) and every stretch of `stride` blocks of every file gives
one. A text file split by a separator is read in blocks too (`sampled_texts`: a document belongs to the block
its start follows). A Parquet or Arrow file's blocks are its groups of rows (row groups, record batches), one in
every `stride` read, or one in every n where the file has n < `stride` (its thresholds scale by n): each file gives
one, and is not decoded whole. A text file that is one document (a source tree's) is a block of its own, one in every
`stride` files read (by a seeded hash of its name): each document is still taken with probability f, and its hash
for that is another. Compressed text split by a separator is read whole (stride 1).

With `stratify_by`, every value of that field (a source, a language) also gets at least `min_group_size`
bytes of text, or all of its documents if it has fewer: each shard keeps, per value, its lowest-hash
documents beyond f + g until they reach that size (a "reserve"), and `training_texts` tops up, in hash
order across all shards, the values whose proportional share fell short. A value rare in the corpus is
then represented, and the others keep their corpus proportions. Finding every value takes every document,
so a stratified sample reads every block; the proportional part still comes from the same blocks, so
stratifying only adds documents to the plain sample.

A document longer than `tokenizer.reference_piece_bytes` is sampled as an excerpt of about that size, from a place its
hash decides: the trainer and the report's hf counts hold ~200 bytes of memory per byte of a text they take at once.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import orjson

from tokenmill.config import TokenmillConfig
from tokenmill.core import layout
from tokenmill.core.commits import SAMPLE, commit, committed
from tokenmill.core.hashing import unit_interval
from tokenmill.core.plan import Plan, Shard
from tokenmill.core.samples import Sampled, group_name
from tokenmill.core.shares import sample_shares
from tokenmill.io.names import compression_of
from tokenmill.io.readers import (
    CORRUPT_STREAM,
    LINE_KINDS,
    SAMPLE_BLOCK_BYTES,
    TABLES,
    Batch,
    Piece,
    ReadOptions,
    kind_of,
    one_document,
    piece_groups,
    read_documents,
    read_lines,
    sampled_blocks,
    sampled_texts,
    separated_text,
    whole_file_sizes,
)
from tokenmill.io.storage import Store
from tokenmill.tokenizers.reference import excerpt

OVERSAMPLE = 4  # the blocks read hold this many times the sample's bytes
# A mixture's sample draws this much more of each source than its share, by input bytes, then keeps the share in
# text bytes (`training_texts`): a source's text is a smaller part of its input where JSON escapes more of it
# (code: about two thirds).
MIX_MARGIN = 1.6


def fractions(config: TokenmillConfig, plan: Plan) -> tuple[float | dict[str, float], float]:
    """(training fraction, held-out fraction) of the corpus: f and g in the module docstring. In a mixture the
    training sample mirrors the mix: f is a fraction per source (`source_fraction`), each source's share of the
    sample its share of the mix (`tokenmill.core.shares.sample_shares`) with a margin that `training_texts` trims; the
    held-out sample stays proportional."""
    total = max(sum(s.bytes for s in plan.shards), 1)
    train = config.tokenizer.train
    f = min(1.0, int(train.sample_size) / total) if train is not None else 0.0
    if train is not None and config.mixture:
        source_bytes = dict.fromkeys(config.inputs(), 0)
        for shard in plan.shards:
            source_bytes[shard.mix_source] += shard.bytes
        shares = sample_shares(config, source_bytes)
        f = {n: min(1.0, MIX_MARGIN * int(train.sample_size) * shares[n] / max(b, 1)) for n, b in source_bytes.items()}
    highest = max(f.values()) if isinstance(f, dict) else f
    g = (
        min(1.0 - highest, on_grid(int(config.fertility.holdout_size) / total))
        if config.writes_fertility_report()
        else 0.0
    )
    return f, g


def on_grid(fraction: float) -> float:
    """`fraction` rounded down to four significant bits (by less than an eighth): the held-out fraction of a corpus
    that grew by a few percent is the same number, so that the shards it had keep their committed samples (a shard's
    sample stage key holds the fraction), and only the new ones are sampled. The exact fraction of a corpus grown by
    one small file had every shard sampled again: 10 s of a 16 s run over a 3 GB mix. Exact in binary: the same
    fraction on every host."""
    if fraction <= 0:
        return fraction
    mantissa, exponent = math.frexp(fraction)  # mantissa in [0.5, 1)
    return math.ldexp(math.floor(mantissa * 16), exponent - 4)


def source_fraction(f: float | dict[str, float], shard: Shard) -> float:
    """A shard's training fraction (`fractions`): its source's, in a mixture."""
    return f[shard.mix_source] if isinstance(f, dict) else f


def stride(f: float, g: float) -> int:
    """The sample draws from one block in this many of each line-based file (1: all of it, when the sample
    is more than 1 / OVERSAMPLE of the corpus)."""
    if f + g <= 0:
        return 1
    return max(1, int(1 / (OVERSAMPLE * (f + g))))


def record_fields(config: TokenmillConfig) -> tuple[str, ...]:
    """The record fields the sample files carry: the stratification field and the report's groupings."""
    stratify = config.tokenizer.train.stratify_by if config.tokenizer.train else None
    return tuple(dict.fromkeys([*([stratify] if stratify else []), *config.fertility.group_by]))


class _Reserve:
    """The lowest-hash documents of one group whose text just reaches `need` bytes (all, if fewer)."""

    def __init__(self, need: int):
        self.need, self.nbytes = need, 0
        self.heap: list[tuple[float, int, bytes]] = []  # (-h, bytes, line): the highest hash on top

    def wants(self, h: float) -> bool:
        """False when full and this document comes later in hash order than every kept one."""
        return self.nbytes < self.need or h < -self.heap[0][0]

    def add(self, h: float, nbytes: int, line: bytes) -> None:
        heapq.heappush(self.heap, (-h, nbytes, line))
        self.nbytes += nbytes
        while self.nbytes - self.heap[0][1] >= self.need:
            self.nbytes -= heapq.heappop(self.heap)[1]


@dataclass(frozen=True)
class Sampling:
    """What the sample stage uses of a run, made once (`of`) and sent with its shards' Dask tasks."""

    store: Store  # the build
    input_key: str  # the input and partition config (`section_hash`), part of each shard's stage key
    reading: dict[str, ReadOptions]  # how each mixture source's files are read: bad records left out, `fields` kept
    fields: tuple[str, ...]  # the record fields the sample files carry (`record_fields`)
    f: float | dict[str, float]  # the training fraction, per source in a mixture (`fractions`)
    g: float  # the held-out fraction
    seed: int
    stratify_by: str | None  # tokenizer.train.stratify_by
    min_group_size: int
    longest: int  # a longer document is sampled as an excerpt of this size (tokenizer.reference_piece_bytes)

    @classmethod
    def of(cls, config: TokenmillConfig, f: float | dict[str, float], g: float) -> Sampling:
        train, fields = config.tokenizer.train, record_fields(config)
        # Bad records are the tokenize stage's to report (it names their file and line; a block read here cannot
        # know its line numbers): the sample only leaves them out.
        reading = {
            name: dataclasses.replace(source.read_options(fields), on_invalid="quarantine")
            for name, source in config.inputs().items()
        }
        return cls(
            config.output.store(), config.section_hash("input", "partition"), reading, fields, f, g,
            train.seed if train else 0, train.stratify_by if train else None, int(train.min_group_size) if train else 0,
            int(config.tokenizer.reference_piece_bytes),
        )  # fmt: skip


def stage_key(run: Sampling, shard: Shard, f: float) -> str:
    stratify = (run.stratify_by, run.min_group_size) if run.stratify_by else None
    blocks = f"blocks-{SAMPLE_BLOCK_BYTES}-{stride(f, run.g)}"
    config_part = f"{run.input_key}-{f!r}-{run.g!r}-{run.seed}-{run.fields}-{stratify}-longest-{run.longest}"
    return f"{config_part}-{blocks}-{shard.source}"


def _documents(
    shard: Shard, options: ReadOptions, every: int, salt: str, read_all: bool
) -> Iterator[tuple[int, Batch, list[str], int]]:
    """(scale, documents, their sampling keys, bytes read) for what the sample reads of the shard: the blocks it draws
    from (scale: the stride they were drawn at, `every`, or a table file's own, where it has fewer groups of rows),
    with `read_all` the other blocks too (scale 0: only for the stratification's reserve), and the whole of other
    pieces (scale 1). A block is SAMPLE_BLOCK_BYTES of a line-based file or of uncompressed separated text, a group
    of rows of a Parquet or Arrow file, a text file that is one document. A key is the document's id, or without an
    id field its file, block and line in the block."""
    for whole_files, run in itertools.groupby(shard.pieces, lambda piece: one_document(piece, options)):
        if not whole_files:
            yield from _blocks_of(run, options, every, salt, read_all)
            continue
        # Text files of one document each (a source tree's): each file a block, read where its phase is 0
        pieces = list(run)
        places = unit_interval([options.name_of(piece.path) for piece in pieces], f"block:{salt}")
        drawn = (places * every).astype(int) == 0
        for scale, chosen in ((every, drawn), (0, ~drawn if read_all else None)):
            if chosen is not None and chosen.any():
                for batch, _ in read_documents([p for p, c in zip(pieces, chosen, strict=True) if c], options, True):
                    yield scale, batch, batch.ids, batch.nbytes


def _blocks_of(
    pieces: Iterable[Piece], options: ReadOptions, every: int, salt: str, read_all: bool
) -> Iterator[tuple[int, Batch, list[str], int]]:
    """`_documents` of pieces that are not whole text files."""
    pieces = list(pieces)
    sizes = {} if read_all else whole_file_sizes(pieces, options)  # a crawl's thousands of small files
    for piece in pieces:
        kind, name = kind_of(piece, options), options.name_of(piece.path)
        place = unit_interval([name], f"block:{salt}")[0]  # the file's phase, as a fraction of the stride
        if kind in TABLES:  # at least one group of rows of each file is read; all where they are not known
            groups, count = piece_groups(piece, options) or (None, 1)
            per = max(1, min(every, count))
            phase = int(place * per)
            wanted = groups if read_all or groups is None else [g for g in groups if g % per == phase]
            if wanted is not None and not wanted:
                continue
            for batch, _ in read_documents([dataclasses.replace(piece, row_groups=wanted)], options, columnar=True):
                drawn = batch.block is not None and batch.block.row_groups[0] % per == phase  # else read on, unplaced
                yield (per if drawn else 0), batch, batch.ids, batch.nbytes
            continue
        phase = int(place * every)
        if sizes.get(piece.path, math.inf) <= phase * SAMPLE_BLOCK_BYTES:
            continue  # its drawn block would start past its end: the file is not opened
        step, at = (1, 0) if read_all else (every, phase)  # the blocks read
        if separated_text(piece, options) and compression_of(piece.path) is None:
            for block, batch, nbytes in sampled_texts(piece, options, step, at):
                yield (every if block % every == phase else 0), batch, batch.ids, nbytes
            continue
        if kind not in LINE_KINDS:  # compressed text split by a separator
            for batch, _ in read_documents([piece], options, columnar=True):
                yield 1, batch, batch.ids, batch.nbytes
            continue
        try:
            for block, lines in sampled_blocks(piece, options, step, at):
                batch, _ = read_lines(lines, 1, f"{name}#{block}", kind, options, set())
                yield (every if block % every == phase else 0), batch, batch.ids, len(lines)
        except CORRUPT_STREAM:  # truncated or corrupt: the sample keeps what came before (tokenize names the file)
            continue


def sample_shard(run: Sampling, shard: Shard) -> Sampled:
    """Write this shard's training sample, held-out sample (and reserve) under `_work/`; return their
    paths and sizes (per group too, when stratified) and the bytes read."""
    store, shard_id, f, g = run.store, shard.shard_id, source_fraction(run.f, shard), run.g
    key = stage_key(run, shard, f)
    if (done := committed(store, SAMPLE, shard_id, key)) is not None:
        return Sampled.from_json(done, reused=True)
    stratify, fields = run.stratify_by, run.fields
    salt = f"sample:{run.seed}:"
    sample: list[bytes] = []
    holdout: list[bytes] = []
    sizes = {"documents": 0, "bytes": 0, "holdout_documents": 0, "holdout_bytes": 0, "bytes_read": 0}
    groups: dict[str, dict[str, int]] = defaultdict(lambda: {"bytes": 0, "sample_bytes": 0})
    reserves: dict[str, _Reserve] = {}

    documents = _documents(shard, run.reading[shard.mix_source], stride(f, g), salt, read_all=bool(stratify))
    for scale, batch, keys, nbytes_read in documents:
        sizes["bytes_read"] += nbytes_read
        hashes = unit_interval(keys, salt)
        train_below, holdout_below = f * scale, (f + g) * scale
        chosen = np.arange(len(batch)) if stratify else np.flatnonzero(hashes < holdout_below)
        texts = batch.text_values()
        texts = texts.take(chosen).to_pylist() if batch.text_array is not None else [texts[i] for i in chosen]
        for i, text in zip(chosen.tolist(), texts, strict=True):
            h = float(hashes[i])
            text = excerpt(text, run.longest, int(h * (1 << 53)))
            values = {name: batch.extra[name][i] for name in fields}
            line = orjson.dumps({"text": text, **values}) + b"\n" if h < holdout_below else b""
            nbytes = len(text.encode())
            if h < train_below:
                sample.append(line)
                sizes["documents"] += 1
                sizes["bytes"] += nbytes
            elif h < holdout_below:
                holdout.append(line)
                sizes["holdout_documents"] += 1
                sizes["holdout_bytes"] += nbytes
            if stratify:
                group = group_name(values[stratify])
                groups[group]["bytes"] += nbytes
                if h < train_below:
                    groups[group]["sample_bytes"] += nbytes
                elif h >= holdout_below:  # in neither sample: a candidate for the group's reserve
                    reserve = reserves.setdefault(group, _Reserve(run.min_group_size))
                    if reserve.wants(h):
                        record = {"h": h, "group": group, "bytes": nbytes, "text": text, **values}
                        reserve.add(h, nbytes, orjson.dumps(record) + b"\n")

    store.write_bytes(layout.sample_file(shard_id), b"".join(sample))
    store.write_bytes(layout.holdout_file(shard_id), b"".join(holdout))
    reserve = None
    if stratify:
        # A group whose share in this shard alone reaches the minimum needs no reserve from this shard.
        kept = [line for group, r in sorted(reserves.items()) if groups[group]["sample_bytes"] < r.need
                for *_, line in sorted(r.heap, reverse=True)]  # fmt: skip
        reserve = layout.reserve_file(shard_id)
        store.write_bytes(reserve, b"".join(kept))
    result = Sampled(
        shard_id, layout.sample_file(shard_id), layout.holdout_file(shard_id), **sizes,
        mix_source=shard.mix_source or None, input_bytes=shard.bytes if shard.mix_source else 0,
        reserve=reserve, groups=dict(sorted(groups.items())),
    )  # fmt: skip
    commit(store, SAMPLE, shard_id, key, result.to_json())
    return result
