import struct
from contextlib import ExitStack

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenmill.core.hashing import assign_splits
from tokenmill.core.packers import ConcatRows, pack_concat
from tokenmill.formats.megatron import CorruptIndex, MegatronReader, token_dtype, write_indexed_dataset
from tokenmill.formats.packed import SUFFIXES, PackedReader, write_packed


def test_megatron_idx_byte_layout(tmp_path):
    docs = [np.array([5, 6, 7]), np.array([1]), np.array([9, 9])]
    write_indexed_dataset(tmp_path / "p", docs, np.uint16)
    idx = (tmp_path / "p.idx").read_bytes()
    expected = (
        b"MMIDIDX\x00\x00"
        + struct.pack("<Q", 1)
        + struct.pack("<B", 8)  # uint16
        + struct.pack("<QQ", 3, 4)
        + np.array([3, 1, 2], np.int32).tobytes()
        + np.array([0, 6, 8], np.int64).tobytes()
        + np.array([0, 1, 2, 3], np.int64).tobytes()
    )
    assert idx == expected
    assert (tmp_path / "p.bin").read_bytes() == np.array([5, 6, 7, 1, 9, 9], np.uint16).tobytes()


def test_megatron_round_trip_int32(tmp_path):
    docs = [np.array([100_000, 3]), np.array([70_000])]
    write_indexed_dataset(tmp_path / "q", docs, np.int32)
    reader = MegatronReader(tmp_path / "q")
    assert reader.index.dtype == np.int32 and len(reader) == 2
    assert [list(reader[i]) for i in range(2)] == [[100_000, 3], [70_000]]


def test_token_dtype_follows_megatron_threshold():
    assert token_dtype(50257) == np.uint16
    assert token_dtype(65500) == np.int32


def test_truncated_index_is_reported_with_its_file(tmp_path):
    write_indexed_dataset(tmp_path / "r", [np.arange(10)], np.uint16)
    (tmp_path / "r.idx").write_bytes((tmp_path / "r.idx").read_bytes()[:-5])
    with pytest.raises(CorruptIndex, match="r.idx"):
        MegatronReader(tmp_path / "r")


def test_concat_packing_hand_checked():
    packed = pack_concat(np.arange(10), np.array([3, 4, 3]), seq_len=4, pad_id=-1)
    assert np.asarray(packed.rows).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, -1, -1]]
    rows = [
        packed.cu_seqlens[a:b].tolist() for a, b in zip(packed.row_offsets[:-1], packed.row_offsets[1:], strict=True)
    ]
    assert rows == [[0, 3, 4], [0, 3, 4], [0, 2]]
    assert (packed.real_tokens, packed.pad_tokens) == (10, 2)


@pytest.mark.parametrize("extra_token", [False, True])
def test_concat_rows_are_written_block_by_block_as_np_save_writes_them(tmp_path, monkeypatch, extra_token):
    # From a memory-mapped .bin, as the pack stage reads it: 57 tokens in 12 rows, 3 to a block, so that a block
    # is a view of the file's tokens (a copy where rows share a token), and the last is padded.
    documents = [np.arange(i * 7, i * 7 + 7) for i in range(7)] + [np.arange(49, 57)]
    write_indexed_dataset(tmp_path / "s", documents, np.uint16)
    reader = MegatronReader(tmp_path / "s")
    monkeypatch.setattr(ConcatRows, "BLOCK_BYTES", 3 * (5 + extra_token) * 2)
    packed = pack_concat(reader.tokens, reader.index.lengths, seq_len=5, pad_id=9999, extra_token=extra_token)
    blocks = [*packed.rows.blocks()]
    assert [len(b) for b in blocks] == [3, 3, 3, 3]
    assert np.shares_memory(blocks[0], reader.tokens) != extra_token
    paths = {key: tmp_path / f"p{suffix}" for key, suffix in SUFFIXES.items()}
    with ExitStack() as stack:
        write_packed({key: stack.enter_context(open(path, "wb")) for key, path in paths.items()}, packed)
    stream = np.append(np.arange(57), [9999] * 4)
    rows = np.lib.stride_tricks.sliding_window_view(stream, 6)[::5] if extra_token else stream[:60].reshape(12, 5)
    expected = tmp_path / "expected.npy"
    np.save(expected, rows.astype(np.uint16))
    assert paths["rows"].read_bytes() == expected.read_bytes()
    assert np.array_equal(PackedReader(tmp_path / "p").rows, rows)


@given(st.lists(st.integers(1, 50), min_size=1, max_size=40), st.integers(2, 64))
def test_concat_packing_keeps_every_token_once_in_order(lengths, seq_len):
    lengths = np.array(lengths)
    tokens = np.arange(lengths.sum())
    packed = pack_concat(tokens, lengths, seq_len, pad_id=-1)
    real = [packed.cu_seqlens[b - 1] for b in packed.row_offsets[1:]]
    stream = np.concatenate([row[:r] for row, r in zip(np.asarray(packed.rows), real, strict=True)])
    assert np.array_equal(stream, tokens)
    # boundaries: every document end inside a row appears in that row's cu_seqlens
    ends = set(np.cumsum(lengths).tolist())
    for i, (a, b) in enumerate(zip(packed.row_offsets[:-1], packed.row_offsets[1:], strict=True)):
        cu = packed.cu_seqlens[a:b]
        inner = {int(c) + i * seq_len for c in cu[1:-1]}
        assert inner <= ends
        assert inner == {e for e in ends if i * seq_len < e < i * seq_len + cu[-1]}


def test_split_assignment_is_stable_and_proportional():
    ids = [f"doc-{i}" for i in range(20000)]
    first = assign_splits(ids, {"train": 0.9, "val": 0.1})
    assert np.array_equal(first[::7], assign_splits(ids[::7], {"train": 0.9, "val": 0.1}))
    assert abs((first == 1).mean() - 0.1) < 0.01
