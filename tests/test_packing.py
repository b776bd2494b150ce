"""Packing modes on their own: every token placed as the mode promises, boundaries agree with the tokens,
best-fit decreasing equal to the textbook algorithm, and >= 99% utilization on real Wikipedia lengths."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.core.packers import (
    Packed,
    best_fit_decreasing,
    fit_conversations,
    global_shuffle_index,
    pack_bfd,
    pack_concat,
    pack_conversations,
    pack_window,
    padded_layout_rows,
)

from .conftest import CORPORA, TOKENIZERS

lengths_strategy = st.lists(st.integers(1, 60), min_size=1, max_size=40)


def row_cuts(packed: Packed) -> list[list[int]]:
    offsets = packed.row_offsets
    return [packed.cu_seqlens[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def pieces(packed: Packed) -> list[np.ndarray]:
    """Every piece of every row: the tokens between consecutive boundaries."""
    return [
        row[a:b]
        for row, cu in zip(np.asarray(packed.rows), row_cuts(packed), strict=True)
        for a, b in zip(cu[:-1], cu[1:], strict=True)
    ]


def document_of(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """With tokens = arange(total), the document each token id belongs to."""
    return np.searchsorted(np.cumsum(lengths), tokens, side="right")


def test_concat_extra_token_rows_share_one_token():
    packed = pack_concat(np.arange(10), np.array([3, 4, 3]), seq_len=4, pad_id=-1, extra_token=True)
    assert np.asarray(packed.rows).tolist() == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [8, 9, -1, -1, -1]]
    assert row_cuts(packed) == [[0, 3, 5], [0, 3, 5], [0, 2]]
    assert (packed.real_tokens, packed.pad_tokens) == (12, 3)


def test_concat_extra_token_document_end_at_the_shared_token():
    packed = pack_concat(np.arange(9), np.array([4, 5]), seq_len=4, pad_id=-1, extra_token=True)
    assert np.asarray(packed.rows).tolist() == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8]]
    assert row_cuts(packed) == [[0, 4, 5], [0, 5]]


@given(lengths_strategy, st.integers(2, 64), st.booleans())
def test_concat_keeps_every_token_once_in_order(lengths, seq_len, extra_token):
    lengths = np.array(lengths)
    tokens = np.arange(lengths.sum())
    packed = pack_concat(tokens, lengths, seq_len, pad_id=-1, extra_token=extra_token)
    rows = np.asarray(packed.rows)
    assert rows.shape[1] == seq_len + extra_token
    # every row's first seq_len tokens, then the rest of the last row, are the stream; with extra_token
    # row i's last token is row i+1's first
    real = [cu[-1] for cu in row_cuts(packed)]
    stream = np.concatenate([*(row[:seq_len] for row in rows[:-1]), rows[-1][: real[-1]]])
    assert np.array_equal(stream, tokens)
    assert all(r == seq_len + extra_token for r in real[:-1])
    if extra_token:
        assert np.array_equal(rows[:-1, -1], rows[1:, 0])
    for piece in pieces(packed):  # boundaries agree with the tokens: a piece is a run of one document
        assert np.array_equal(piece, np.arange(piece[0], piece[0] + len(piece)))
        assert len(set(document_of(piece, lengths))) == 1
    ends = set(np.cumsum(lengths).tolist())
    for i, cu in enumerate(row_cuts(packed)):
        inner = {i * seq_len + c for c in cu[1:-1]}
        assert inner == {e for e in ends if i * seq_len < e < i * seq_len + cu[-1]}


def test_bfd_hand_checked():
    # pieces (seq_len 5): doc0 [0..3) 3; doc1 [3..8) 5 + [8..12) 4; doc2 [12..14) 2; doc3 [14..19) 5 + [19] 1
    packed = pack_bfd(np.arange(20), np.array([3, 9, 2, 6]), seq_len=5, pad_id=-1)
    assert packed.rows.tolist() == [[3, 4, 5, 6, 7], [14, 15, 16, 17, 18], [8, 9, 10, 11, 19], [0, 1, 2, 12, 13]]
    assert row_cuts(packed) == [[0, 5], [0, 5], [0, 4, 5], [0, 3, 5]]


def test_bfd_pads_the_tail_of_each_row():
    packed = pack_bfd(np.arange(9), np.array([4, 3, 2]), seq_len=5, pad_id=-1)
    assert packed.rows.tolist() == [[0, 1, 2, 3, -1], [4, 5, 6, 7, 8]]
    assert row_cuts(packed) == [[0, 4], [0, 3, 5]]
    assert (packed.real_tokens, packed.pad_tokens) == (9, 1)


@given(lengths_strategy, st.integers(2, 64))
def test_bfd_keeps_every_token_once_and_documents_in_order(lengths, seq_len):
    lengths = np.array(lengths)
    tokens = np.arange(lengths.sum())
    packed = pack_bfd(tokens, lengths, seq_len, pad_id=-1)
    found = pieces(packed)
    # Sorted by first token the pieces rebuild the stream: every token once, each piece a contiguous run.
    assert np.array_equal(np.concatenate(sorted(found, key=lambda p: p[0])), tokens)
    for piece in found:
        assert len(set(document_of(piece, lengths))) == 1  # a piece never spans two documents
    # only documents longer than a row are cut, into full rows and one remainder
    assert len(found) == padded_layout_rows(lengths, seq_len)
    assert packed.real_tokens == lengths.sum() and np.all(packed.rows.reshape(-1)[packed.rows.reshape(-1) < 0] == -1)


def reference_best_fit_decreasing(sizes: list[int], capacity: int) -> tuple[list[int], list[int]]:
    """The textbook algorithm, one item at a time over all bins: longest item first (ties in input
    order) into the bin with the least room that fits it (ties: the bin that reached that room first)."""
    rooms, reached, item_bin, item_offset = [], [], [0] * len(sizes), [0] * len(sizes)
    for clock, i in enumerate(sorted(range(len(sizes)), key=lambda i: -sizes[i])):
        fitting = [b for b, room in enumerate(rooms) if room >= sizes[i]]
        if fitting:
            b = min(fitting, key=lambda b: (rooms[b], reached[b]))
        else:
            b = len(rooms)
            rooms.append(capacity)
            reached.append(-1)
        item_bin[i], item_offset[i] = b, capacity - rooms[b]
        rooms[b] -= sizes[i]
        reached[b] = clock
    return item_bin, item_offset


@settings(max_examples=300)
@given(st.integers(1, 40).flatmap(lambda c: st.tuples(st.just(c), st.lists(st.integers(1, c), max_size=80))))
def test_best_fit_decreasing_equals_the_textbook_algorithm(case):
    capacity, sizes = case
    item_bin, item_offset, n_bins = best_fit_decreasing(np.array(sizes, dtype=np.int64), capacity)
    expected_bin, expected_offset = reference_best_fit_decreasing(sizes, capacity)
    assert item_bin.tolist() == expected_bin and item_offset.tolist() == expected_offset
    assert n_bins == (max(expected_bin) + 1 if sizes else 0)


def test_best_fit_decreasing_hand_checked():
    # 5 | 4 | 3 3 | then 2: the bin with room 2 (exactly), a new bin, the same new bin | 1: the bin with room 1
    item_bin, item_offset, n_bins = best_fit_decreasing(np.array([5, 3, 3, 2, 2, 2, 1, 4]), 6)
    assert (item_bin.tolist(), item_offset.tolist(), n_bins) == ([0, 2, 2, 1, 3, 3, 0, 1], [0, 0, 3, 4, 0, 2, 5, 0], 4)


def test_window_hand_checked():
    # seq_len 6 with BOS 100 and EOS 101: 4 document tokens a window, neighbours sharing 2
    packed = pack_window(np.arange(20), np.array([3, 11, 6]), seq_len=6, pad_id=-1, stride=2, bos_id=100, eos_id=101)
    assert packed.rows.tolist() == [
        [100, 0, 1, 2, 101, -1],
        [100, 3, 4, 5, 6, 101],
        [100, 5, 6, 7, 8, 101],
        [100, 7, 8, 9, 10, 101],
        [100, 9, 10, 11, 12, 101],
        [100, 11, 12, 13, 101, -1],
        [100, 14, 15, 16, 17, 101],
        [100, 16, 17, 18, 19, 101],
    ]
    assert row_cuts(packed) == [[0, 5], [0, 6], [0, 6], [0, 6], [0, 6], [0, 5], [0, 6], [0, 6]]


@given(lengths_strategy, st.integers(3, 40), st.data(), st.booleans(), st.booleans())
def test_window_covers_each_document_with_the_promised_overlap(lengths, seq_len, data, bos, eos):
    lengths = np.array(lengths)
    content = seq_len - bos - eos
    stride = data.draw(st.integers(0, content - 1))
    tokens = np.arange(lengths.sum())
    packed = pack_window(tokens, lengths, seq_len, -1, stride, 1000 if bos else None, 1001 if eos else None)
    windows = [row[bos : cu[-1] - eos] for row, cu in zip(packed.rows, row_cuts(packed), strict=True)]
    assert all(len(cu) == 2 for cu in row_cuts(packed))  # one window per row
    if bos:
        assert np.all(packed.rows[:, 0] == 1000)
    if eos:
        assert all(row[cu[-1] - 1] == 1001 for row, cu in zip(packed.rows, row_cuts(packed), strict=True))
    starts = np.cumsum(lengths) - lengths
    w = 0
    for start, length in zip(starts, lengths, strict=True):
        rebuilt = list(windows[w])
        w += 1
        while len(rebuilt) < length:  # each next window repeats the last `stride` tokens, then goes on
            assert len(windows[w - 1]) == content
            assert windows[w][:stride].tolist() == rebuilt[-stride:] if stride else True
            rebuilt += windows[w][stride:].tolist()
            w += 1
        assert rebuilt == list(range(start, start + length))
    assert w == len(windows)


def test_padded_layout_counts_one_document_per_row():
    assert padded_layout_rows(np.array([1, 4, 5, 9]), 4) == 1 + 1 + 2 + 3


def test_global_shuffle_index_is_a_seeded_permutation_of_every_row():
    index = global_shuffle_index([(0, 3), (2, 2), (5, 1)], seed=7)
    assert index.dtype == np.int32 and index.shape == (6, 2)
    assert sorted(map(tuple, index.tolist())) == [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (5, 0)]
    assert np.array_equal(index, global_shuffle_index([(0, 3), (2, 2), (5, 1)], seed=7))
    assert not np.array_equal(index, global_shuffle_index([(0, 3), (2, 2), (5, 1)], seed=8))


ENWIKI_DOCUMENTS = 8000  # a fifth of enwiki_slice keeps this test near 10 s; bench/pack.py runs the whole slice


@pytest.fixture(scope="session")
def enwiki_gpt2_documents() -> tuple[np.ndarray, np.ndarray]:
    """The first ENWIKI_DOCUMENTS articles of enwiki_slice encoded with GPT-2, EOD after each: (tokens, lengths)."""
    from tokenizers import Tokenizer

    with gzip.open(CORPORA / "enwiki_slice" / "enwiki_slice.jsonl.gz", "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line, _ in zip(f, range(ENWIKI_DOCUMENTS), strict=False)]
    tokenizer = Tokenizer.from_file(str(TOKENIZERS / "gpt2" / "tokenizer.json"))
    eod = tokenizer.token_to_id("<|endoftext|>")
    docs = [e.ids + [eod] for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    return np.concatenate(docs).astype(np.uint16), np.array([len(d) for d in docs])


def test_bfd_on_enwiki_reaches_99_percent_utilization_at_2048(enwiki_gpt2_documents):
    tokens, lengths = enwiki_gpt2_documents
    packed = pack_bfd(tokens, lengths, seq_len=2048, pad_id=50256)
    utilization = packed.real_tokens / packed.rows.size
    padded_rows = padded_layout_rows(lengths, 2048)
    padded_utilization = lengths.sum() / (padded_rows * 2048)
    print(f"bfd {utilization:.4%} in {len(packed.rows)} rows; padded layout {padded_utilization:.2%} in {padded_rows}")
    assert packed.real_tokens == len(tokens) and utilization >= 0.99
    assert padded_utilization < 0.5  # what packing buys back: most short articles would be padding


def targets(tokens: np.ndarray, masks: np.ndarray, positions: np.ndarray) -> Counter:
    """Each token that carries loss with the token before it and its place in its conversation."""
    where = np.flatnonzero(masks[1:]) + 1
    return Counter(zip(tokens[where - 1].tolist(), tokens[where].tolist(), positions[where].tolist(), strict=True))


def unpacked_targets(tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray) -> Counter:
    found, start = Counter(), 0
    for length in lengths.tolist():
        span = slice(start, start + length)
        found += targets(tokens[span], masks[span], np.arange(length))
        start += length
    return found


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 2**31)), min_size=1, max_size=40), st.integers(40, 64))
def test_conversations_packed_carry_the_objective_they_carry_unpacked(conversations, seq_len):
    """Whatever the masks (the first token's too), packed rows have exactly the unpacked (previous token, target,
    position) triples that carry loss: none across a boundary, positions restarting with each conversation."""
    lengths = np.array([length for length, _ in conversations])
    rng = np.random.default_rng(sum(seed for _, seed in conversations))
    tokens = rng.integers(0, 50, lengths.sum())
    masks = rng.integers(0, 2, lengths.sum()).astype(np.uint8)
    rows = pack_conversations(tokens, masks, lengths, seq_len, pad_id=-1)
    packed = Counter()
    for row, loss, positions in zip(np.asarray(rows.packed.rows), rows.loss, rows.positions, strict=True):
        packed += targets(row, loss, positions)
        assert loss[row == -1].sum() == 0 and positions[row == -1].sum() == 0
    assert packed == unpacked_targets(tokens, masks, lengths)
    starts = [cu[:-1] for cu in row_cuts(rows.packed)]
    for loss, positions, cut in zip(rows.loss, rows.positions, starts, strict=True):
        assert loss[cut].sum() == 0 and positions[cut].tolist() == [0] * len(cut)


def test_a_conversation_longer_than_a_row_is_refused():
    with pytest.raises(ValueError, match="a conversation of 9 tokens does not fit a row of 8"):
        pack_conversations(np.arange(12), np.ones(12), np.array([3, 9]), seq_len=8, pad_id=-1)


@pytest.mark.parametrize(
    ("policy", "lengths", "kept", "lost"),
    [
        ("drop", [3], [0, 1, 2], 15),
        ("truncate", [3, 4, 4], [0, 1, 2, 3, 4, 5, 6, 13, 14, 15, 16], 7),
        ("split", [3, 4, 4, 2, 4, 1], list(range(18)), 0),
    ],
)
def test_conversations_longer_than_a_row_are_dropped_truncated_or_split_and_counted(policy, lengths, kept, lost):
    tokens = np.arange(18)
    fitted = fit_conversations(tokens, tokens % 2, np.array([3, 10, 5]), seq_len=4, policy=policy)
    assert fitted.lengths.tolist() == lengths and fitted.tokens.tolist() == kept
    assert fitted.masks.tolist() == [t % 2 for t in kept]  # each token keeps its mask
    assert (fitted.longer, fitted.tokens_lost) == (2, lost)
    packed = pack_conversations(fitted.tokens, fitted.masks, fitted.lengths, 4, pad_id=-1)
    assert packed.packed.real_tokens == len(kept)
