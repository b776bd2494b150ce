"""The packing modes: tokenized documents into fixed-length rows, with the document boundaries of every row.

Pure numpy over one split of one shard: `tokens` is the documents back to back, `lengths` their
lengths. Every mode returns a `Packed`: rows `[n_rows, row_len]`, each row's real tokens first and
then `pad_id` (concat's cut from the tokens only as they are written: `ConcatRows`), and per row its
boundaries (`cu_seqlens`: 0, the end of each piece, the real length).

- `concat` (Megatron's GPTDataset, nanoGPT): documents joined into one stream cut into `seq_len`
  rows; only the last row is padded. With `extra_token` rows are `seq_len + 1` wide and row i
  starts at `i * seq_len`, so consecutive rows share one token (the last label of one row is the
  first input of the next).
- `bfd`: best-fit decreasing. Documents longer than `seq_len` are cut into `seq_len` pieces and a
  remainder; pieces go, longest first, into the fullest row that still has room for them.
- `window`: each document cut into windows of `seq_len` (less BOS/EOS) tokens whose neighbours share
  `stride` tokens; one window per row, BOS and EOS around each window when configured.

Conversations (chat data, with loss masks) longer than a row are dropped, truncated or split by
`fit_conversations`, then packed whole by `pack_conversations`: best-fit decreasing, with positions restarting per
conversation and no loss on a conversation's first token, so that packed and unpacked rows train the same
objective. Preference pairs are packed alike by `pack_pairs`, a pair's chosen and rejected sequences whole in one
row.

Plus the global shuffle index over a split's rows across shards, and what the config asks the pack stage to write
(`writes_packed`, `writes_files`) with which pad id.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tokenmill.config import PackConfig, TokenmillConfig
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo


@dataclass
class Packed:
    rows: np.ndarray | ConcatRows  # [n_rows, row_len] tokens, real tokens first, then pad
    cu_seqlens: np.ndarray  # int32, flat: per row [0, end of 1st piece, ..., real tokens of the row]
    row_offsets: np.ndarray  # int64 [n_rows + 1]: row i's cu_seqlens are cu_seqlens[off[i]:off[i+1]]

    @property
    def real_lengths(self) -> np.ndarray:
        """Real (not pad) tokens of each row: the last boundary of the row."""
        return self.cu_seqlens[self.row_offsets[1:] - 1].astype(np.int64)

    @property
    def real_tokens(self) -> int:
        return int(self.real_lengths.sum())

    @property
    def pad_tokens(self) -> int:
        return self.rows.size - self.real_tokens


def pack(tokens: np.ndarray, lengths: np.ndarray, config: PackConfig, pad_id: int) -> Packed:
    """Pack one split of one shard as `config.mode` says (not `none`)."""
    tokens, lengths = np.asarray(tokens), np.asarray(lengths, dtype=np.int64)
    if config.mode == "concat":
        return pack_concat(tokens, lengths, config.seq_len, pad_id, extra_token=config.extra_token)
    if config.mode == "bfd":
        return pack_bfd(tokens, lengths, config.seq_len, pad_id)
    if config.mode == "window":
        return pack_window(tokens, lengths, config.seq_len, pad_id, config.stride, config.bos_id, config.eos_id)
    raise ValueError(f"pack mode {config.mode!r} writes no rows")


def padded_layout_rows(lengths: np.ndarray, seq_len: int) -> int:
    """Rows the same documents take one per row, padded (a document longer than a row takes several)."""
    return int((-(-np.asarray(lengths, dtype=np.int64) // seq_len)).sum())


class ConcatRows:
    """`concat`'s rows, cut from the token stream as they are written rather than held: a copy of a shard's
    tokens was the largest thing a worker held (0.4 GB for a 750 MB shard). Rows come in blocks of about
    BLOCK_BYTES (`blocks`), views of `tokens` where no row of the block is padded or shares a token; `np.asarray`
    makes the whole array."""

    BLOCK_BYTES = 8 << 20

    def __init__(self, tokens: np.ndarray, seq_len: int, pad_id: int, extra_token: bool):
        self.tokens, self.seq_len, self.pad_id, self.extra_token = tokens, seq_len, pad_id, extra_token
        total = len(tokens)
        n_rows = max(1, -(-(total - extra_token) // seq_len)) if total else 0
        self.dtype, self.shape = tokens.dtype, (n_rows, seq_len + extra_token)
        self.size = n_rows * self.shape[1]

    def __len__(self) -> int:
        return self.shape[0]

    def blocks(self) -> Iterator[np.ndarray]:
        """The rows in order, a C-contiguous block of them at a time."""
        n_rows, width = self.shape
        step = max(1, self.BLOCK_BYTES // (width * self.dtype.itemsize))
        for first in range(0, n_rows, step):
            last = min(n_rows, first + step)
            # Row i is stream[i * seq_len : i * seq_len + width]; the stream is the tokens, then pad.
            start, stop = first * self.seq_len, (last - 1) * self.seq_len + width
            stream = self.tokens[start:stop]
            if len(stream) < stop - start:
                stream = np.concatenate([stream, np.full(stop - start - len(stream), self.pad_id, self.dtype)])
            if self.extra_token:
                yield np.lib.stride_tricks.sliding_window_view(stream, width)[:: self.seq_len].copy()
            else:
                yield np.ascontiguousarray(stream).reshape(last - first, width)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        rows = np.concatenate([*self.blocks()]) if len(self) else np.zeros(self.shape, self.dtype)
        return rows if dtype is None else rows.astype(dtype)


def pack_concat(
    tokens: np.ndarray, lengths: np.ndarray, seq_len: int, pad_id: int, *, extra_token: bool = False
) -> Packed:
    rows = ConcatRows(tokens, seq_len, pad_id, extra_token)
    (n_rows, width), total = rows.shape, len(tokens)
    real = np.minimum(width, total - np.arange(n_rows, dtype=np.int64) * seq_len)
    # A document end e inside the stream closes a piece of row (e - 1) // seq_len, at e - row * seq_len
    # (with extra_token too: an end at the shared token is the next row's 0, which every row has anyway;
    # only the stream's end can fall past the last row, and a row's end is never an inner cut).
    doc_ends = np.cumsum(lengths, dtype=np.int64)  # sorted: np.unique's hashing was 1-2% of a default run's CPU
    doc_ends = doc_ends[np.diff(doc_ends, prepend=0) > 0]  # empty documents end nowhere new
    row_of_end = np.minimum((doc_ends - 1) // seq_len, n_rows - 1)
    local_end = doc_ends - row_of_end * seq_len
    inner = local_end < real[row_of_end]
    # Each row's cuts: its inner document ends, then its real length (stable sort keeps that order).
    cut_rows = np.concatenate([row_of_end[inner], np.arange(n_rows)])
    cuts = np.concatenate([local_end[inner], real])
    order = np.argsort(cut_rows, kind="stable")
    return Packed(rows, *_boundaries(cut_rows[order], cuts[order], n_rows))


def pack_bfd(tokens: np.ndarray, lengths: np.ndarray, seq_len: int, pad_id: int) -> Packed:
    piece_start, piece_len = document_pieces(lengths, seq_len)
    piece_row, piece_offset, n_rows = best_fit_decreasing(piece_len, seq_len)
    rows = np.full((n_rows, seq_len), pad_id, dtype=tokens.dtype)
    # Token t of a piece goes to its row's slot offset + (t - piece start): one scatter for all pieces.
    destination = np.arange(len(tokens), dtype=np.int64)
    destination += np.repeat(piece_row * seq_len + piece_offset - piece_start, piece_len)
    rows.reshape(-1)[destination] = tokens
    del destination
    order = np.lexsort((piece_offset, piece_row))
    return Packed(rows, *_boundaries(piece_row[order], (piece_offset + piece_len)[order], n_rows))


@dataclass
class Fitted:
    """Conversations made to fit rows of `seq_len` (`fit_conversations`), and what that did to them."""

    tokens: np.ndarray
    masks: np.ndarray
    lengths: np.ndarray
    longer: int  # conversations longer than a row: dropped, truncated or split, as the policy said
    tokens_lost: int  # their tokens not kept (dropped, or cut off)


def fit_conversations(tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray, seq_len: int, policy: str) -> Fitted:
    """Each conversation longer than `seq_len` dropped, truncated to its first `seq_len` tokens, or split into
    `seq_len` pieces and a remainder (each piece then a sequence of its own, whose first token carries no loss
    once packed), as `policy` ("drop", "truncate", "split") says; counted, never cut silently."""
    if policy not in ("drop", "truncate", "split"):
        raise ValueError(f"policy {policy!r}: drop, truncate or split")
    lengths = np.asarray(lengths, dtype=np.int64)
    over = lengths > seq_len
    if policy == "split":
        start, length = document_pieces(lengths, seq_len)
        keep = np.repeat(True, len(start))
    else:
        start, length = np.cumsum(lengths) - lengths, np.minimum(lengths, seq_len)
        keep = ~over if policy == "drop" else np.ones(len(lengths), dtype=bool)
    start, length = start[keep], length[keep]
    taken = np.repeat(start - (np.cumsum(length) - length), length) + np.arange(length.sum())
    return Fitted(tokens[taken], masks[taken], length, int(over.sum()), int(lengths.sum() - length.sum()))


@dataclass
class PackedConversations:
    """Conversations packed whole into rows, as `pack_conversations` makes them."""

    packed: Packed  # the tokens' rows and each row's conversation boundaries
    loss: np.ndarray  # uint8 [n_rows, seq_len]: 1 where the token is a target that carries loss
    positions: np.ndarray  # int32 [n_rows, seq_len]: each token's place in its conversation (pad: 0)


def pack_conversations(
    tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray, seq_len: int, pad_id: int
) -> PackedConversations:
    """Conversations (their tokens back to back, each at most `seq_len`) packed best-fit decreasing, whole, as
    `pack_bfd` places them, with their loss masks (a 1 on a token the loss is computed on) placed alike.

    Training on a row, a model predicts each token from the ones before it in the row: a conversation's first
    token follows another conversation's last, so it never carries loss there (unpacked, it has nothing before it
    and carries none either). Every packed row so has the targets, each with the tokens before it, of the same
    conversations unpacked: the same objective. Positions restart at 0 with each conversation (with `cu_seqlens`,
    what varlen attention needs so that no token attends across a boundary)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and lengths.max() > seq_len:
        raise ValueError(f"a conversation of {lengths.max()} tokens does not fit a row of {seq_len}")
    packed = pack_bfd(np.asarray(tokens), lengths, seq_len, pad_id)
    loss = pack_bfd(np.asarray(masks, dtype=np.uint8), lengths, seq_len, 0).rows
    return _each_sequence_apart(packed, loss, seq_len)


def pack_pairs(
    tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray, seq_len: int, pad_id: int
) -> PackedConversations:
    """Preference pairs packed whole, best-fit decreasing: `lengths` are each pair's chosen then rejected sequence
    (prompt and completion each: `preference.pair_sequences`), back to back in `tokens` with their loss masks. A
    pair's two sequences go to the same row, next to each other, chosen first, each a sequence of its own (its
    `cu_seqlens`, positions restarting): a row never holds half a pair, and neither side attends to the other. As
    with conversations, a sequence's first token carries no loss, so packed rows train each pair's objective
    unpacked."""
    tokens, lengths = np.asarray(tokens), np.asarray(lengths, dtype=np.int64)
    if len(lengths) % 2 or (len(lengths) and lengths.min() < 1):
        raise ValueError("pairs come as two sequences each (chosen, rejected), each of at least one token")
    sizes = lengths[0::2] + lengths[1::2]
    if len(sizes) and sizes.max() > seq_len:
        raise ValueError(f"a pair of {sizes.max()} tokens (its two sequences) does not fit a row of {seq_len}")
    pair_row, pair_offset, n_rows = best_fit_decreasing(sizes, seq_len)
    row, offset = np.repeat(pair_row, 2), np.repeat(pair_offset, 2)
    offset[1::2] += lengths[0::2]  # the rejected sequence right after the chosen one
    destination = np.arange(len(tokens), dtype=np.int64)
    destination += np.repeat(row * seq_len + offset - (np.cumsum(lengths) - lengths), lengths)
    rows = np.full((n_rows, seq_len), pad_id, dtype=tokens.dtype)
    rows.reshape(-1)[destination] = tokens
    loss = np.zeros((n_rows, seq_len), dtype=np.uint8)
    loss.reshape(-1)[destination] = masks
    order = np.lexsort((offset, row))
    packed = Packed(rows, *_boundaries(row[order], (offset + lengths)[order], n_rows))
    return _each_sequence_apart(packed, loss, seq_len)


def _each_sequence_apart(packed: Packed, loss: np.ndarray, seq_len: int) -> PackedConversations:
    """Packed sequences with their loss, each sequence's first token's loss removed (it follows another sequence's
    last token in the row) and the positions restarting at 0 with each."""
    n_rows = len(packed.row_offsets) - 1
    ends = np.zeros(len(packed.cu_seqlens), dtype=bool)
    ends[packed.row_offsets[1:] - 1] = True  # each row's last boundary is its real length, not a start
    row = np.repeat(np.arange(n_rows), np.diff(packed.row_offsets))
    starts = (row * seq_len + packed.cu_seqlens)[~ends]
    loss.reshape(-1)[starts] = 0
    first = np.zeros(n_rows * seq_len, dtype=np.int64)
    first[starts] = starts
    positions = (np.arange(n_rows * seq_len) - np.maximum.accumulate(first)).reshape(n_rows, seq_len)
    positions[np.arange(seq_len) >= packed.real_lengths[:, None]] = 0  # pad
    return PackedConversations(packed, loss, positions.astype(np.int32))


def pack_window(
    tokens: np.ndarray,
    lengths: np.ndarray,
    seq_len: int,
    pad_id: int,
    stride: int,
    bos_id: int | None = None,
    eos_id: int | None = None,
) -> Packed:
    has_bos, has_eos = int(bos_id is not None), int(eos_id is not None)
    content = seq_len - has_bos - has_eos
    step = content - stride
    if content < 1 or step < 1:
        raise ValueError(f"a window of {seq_len} holds {content} document tokens: stride {stride} must be below it")
    # The fewest windows of a document so that the last one reaches its end: 1 + ceil((len - content) / step).
    windows = np.where(lengths > 0, 1 + -(-np.maximum(lengths - content, 0) // step), 0)
    doc = np.repeat(np.arange(len(lengths)), windows)
    first = np.cumsum(windows) - windows
    within = (np.arange(len(doc)) - first[doc]) * step
    window_len = np.minimum(content, lengths[doc] - within)
    source_start = (np.cumsum(lengths) - lengths)[doc] + within
    n_rows = len(doc)
    rows = np.full((n_rows, seq_len), pad_id, dtype=tokens.dtype)
    copied = np.cumsum(window_len) - window_len  # where each window starts in the flat run of copies
    step_through = np.arange(int(window_len.sum()), dtype=np.int64) - np.repeat(copied, window_len)
    source = np.repeat(source_start, window_len) + step_through
    rows.reshape(-1)[np.repeat(np.arange(n_rows) * seq_len + has_bos, window_len) + step_through] = tokens[source]
    if has_bos:
        rows[:, 0] = bos_id
    if has_eos:
        rows[np.arange(n_rows), has_bos + window_len] = eos_id
    return Packed(rows, *_boundaries(np.arange(n_rows), has_bos + window_len + has_eos, n_rows))


def best_fit_decreasing(sizes: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Best-fit decreasing bin packing of integer `sizes` (each 1..capacity) into bins of `capacity`.

    Items are placed longest first (ties in input order), each into the bin with the least room that
    still fits it (ties: the bin that reached that room first), or into a new bin. Returns each item's
    bin, its offset in the bin (items in placement order) and the number of bins.

    Not one item at a time: equal sizes are placed as a group, and bins are kept in buckets by their
    remaining room. A group of size s walks the rooms >= s upwards; a bin with room r takes r // s
    items in a row (after each its room is still the least that fits), so every bucket visited but
    the last is emptied. That is O(n log n) for the sort plus O(distinct sizes) bucket visits, each a
    few numpy slices, instead of the quadratic scan of first-fit over all open bins.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if not len(sizes):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    if not (sizes.min() >= 1 and sizes.max() <= capacity):
        raise ValueError(f"item sizes must be within 1..{capacity}")
    order = np.argsort(-sizes, kind="stable")
    sorted_sizes = sizes[order]
    group_starts = np.flatnonzero(np.diff(sorted_sizes, prepend=-1))
    group_ends = np.append(group_starts[1:], len(sizes))

    buckets: dict[int, deque[np.ndarray]] = {}  # remaining room -> its bins, in order of arrival
    bucket_sizes: dict[int, int] = {}
    rooms: list[int] = []  # the rooms that have bins, ascending
    n_bins = 0
    placed: list[np.ndarray] = []  # bin of each item, in placement (= sorted) order

    def take(room: int, n: int) -> np.ndarray:
        """The first n bins of bucket `room`, removed from it."""
        chunks, taken = buckets[room], []
        while n:
            chunk = chunks.popleft()
            if len(chunk) > n:
                chunks.appendleft(chunk[n:])
                chunk = chunk[:n]
            taken.append(chunk)
            n -= len(chunk)
        return np.concatenate(taken) if len(taken) > 1 else taken[0]

    for start, end in zip(group_starts.tolist(), group_ends.tolist(), strict=True):
        size, left = int(sorted_sizes[start]), end - start
        moves: list[tuple[np.ndarray, int, np.ndarray]] = []  # (bins, their room, items each took)
        i = bisect_left(rooms, size)
        while left and i < len(rooms):
            room = rooms[i]
            each = room // size
            n = min(bucket_sizes[room], -(-left // each))
            bins = take(room, n)
            bucket_sizes[room] -= n
            if not bucket_sizes[room]:
                del buckets[room], bucket_sizes[room], rooms[i]
            else:
                i += 1
            counts = np.full(n, each, dtype=np.int64)
            counts[-1] = min(each, left - each * (n - 1))
            placed.append(np.repeat(bins, counts))
            left -= int(counts.sum())
            moves.append((bins, room, counts))
        if left:  # no bin has room for the rest: new bins, each filled with as many as fit
            each = capacity // size
            n = -(-left // each)
            bins = np.arange(n_bins, n_bins + n, dtype=np.int64)
            n_bins += n
            counts = np.full(n, each, dtype=np.int64)
            counts[-1] = left - each * (n - 1)
            placed.append(np.repeat(bins, counts))
            moves.append((bins, capacity, counts))
        # The bins that took items now have room < size: they cannot affect this group, only later ones.
        for bins, room, counts in moves:
            for took in np.unique(counts)[::-1]:  # the full ones first: they took their items first
                new_room = room - int(took) * size
                if new_room:
                    if new_room not in buckets:
                        buckets[new_room], bucket_sizes[new_room] = deque(), 0
                        insort(rooms, new_room)
                    moved = bins[counts == took]
                    buckets[new_room].append(moved)
                    bucket_sizes[new_room] += len(moved)

    bin_sorted = np.concatenate(placed) if placed else np.zeros(0, np.int64)
    # Offsets: within each bin, the sizes of the items placed in it before.
    by_bin = np.argsort(bin_sorted, kind="stable")
    ends = np.cumsum(sorted_sizes[by_bin])
    bin_ends = np.zeros(n_bins + 1, dtype=np.int64)
    np.cumsum(np.bincount(bin_sorted, weights=sorted_sizes, minlength=n_bins).astype(np.int64), out=bin_ends[1:])
    offset_sorted = np.empty(len(sizes), dtype=np.int64)
    offset_sorted[by_bin] = ends - sorted_sizes[by_bin] - bin_ends[bin_sorted[by_bin]]
    item_bin, item_offset = np.empty_like(bin_sorted), np.empty_like(offset_sorted)
    item_bin[order], item_offset[order] = bin_sorted, offset_sorted
    return item_bin, item_offset, n_bins


def global_shuffle_index(rows_per_shard: list[tuple[int, int]], seed: int) -> np.ndarray:
    """A seeded permutation of every row of a split across its shards: int32 `[n_rows, 2]`, entry p being
    the (shard id, row) read p-th. `rows_per_shard` is (shard id, rows) in shard order."""
    shard_ids = np.array([s for s, _ in rows_per_shard], dtype=np.int64)
    counts = np.array([n for _, n in rows_per_shard], dtype=np.int64)
    total = int(counts.sum())
    shard = np.repeat(shard_ids, counts)
    row = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    permutation = np.random.default_rng(seed).permutation(total)
    return np.stack([shard[permutation], row[permutation]], axis=1).astype(np.int32)


def document_pieces(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Documents cut into `seq_len` pieces and a remainder: each piece's start in the stream and length."""
    per_doc = -(-lengths // seq_len)
    doc = np.repeat(np.arange(len(lengths)), per_doc)
    within = (np.arange(len(doc)) - (np.cumsum(per_doc) - per_doc)[doc]) * seq_len
    start = (np.cumsum(lengths) - lengths)[doc] + within
    return start, np.minimum(seq_len, lengths[doc] - within)


def _boundaries(row_of_cut: np.ndarray, cut: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat `cu_seqlens` and `row_offsets` from the cuts of each row (grouped by row, ascending within a
    row, the last one of a row its real length); a 0 opens every row."""
    cuts_per_row = np.bincount(row_of_cut, minlength=n_rows)
    row_offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(cuts_per_row + 1, out=row_offsets[1:])
    cu_seqlens = np.zeros(row_offsets[-1], dtype=np.int32)
    is_cut = np.ones(row_offsets[-1], dtype=bool)
    is_cut[row_offsets[:-1]] = False
    cu_seqlens[is_cut] = cut
    return cu_seqlens, row_offsets


def writes_packed(config: TokenmillConfig) -> bool:
    """Packed rows are written when a pack mode is chosen and `output.formats` asks for them."""
    return config.pack.mode != "none" and "packed" in config.output.formats


def writes_files(config: TokenmillConfig) -> bool:
    """The pack stage has something to write (packed rows, llm.c files, a trainer's layout); without it the stage
    is skipped."""
    formats = config.output.formats
    return writes_packed(config) or "llmc" in formats or bool(config.output.trainers())


def pad_id(config: TokenmillConfig, tokenizer: TokenizerInfo) -> int:
    return tokenizer.eod_id if config.pack.pad_id is None else config.pack.pad_id
