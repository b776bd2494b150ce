"""The loader: training samples (input_ids, labels, position_ids, cu_seqlens) from packed rows, hand-checked
and against a token-by-token reference on random packings; the split in shuffle order; the torch Dataset
split across ranks and workers without overlap; numpy only until torch is asked for."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenmill.core.packers import pack_bfd, pack_concat
from tokenmill.formats.packed import PackedReader
from tokenmill.loader import IGNORE_INDEX, PackedSplit, training_sample

from .conftest import REPO
from .test_packing_pipeline import MODES, build_dataset, dataset_config


def test_sample_of_a_padded_row_hand_checked():
    row, cu = np.array([5, 6, 7, 8, 9, 1, 2, 0]), np.array([0, 3, 7])
    sample = training_sample(row, cu)
    assert sample["input_ids"].tolist() == [5, 6, 7, 8, 9, 1, 2, 0]
    assert sample["labels"].tolist() == [6, 7, -100, 9, 1, 2, -100, -100]
    assert sample["position_ids"].tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert sample["cu_seqlens"].tolist() == [0, 3, 7, 8]  # the padding is the last segment
    unmasked = training_sample(row, cu, mask_cross_document_labels=False)
    assert unmasked["labels"].tolist() == [6, 7, 8, 9, 1, 2, -100, -100]


def test_sample_of_an_extra_token_row_hand_checked():
    sample = training_sample(np.array([1, 2, 3, 4, 5]), np.array([0, 2, 5]), extra_token=True)
    assert sample["input_ids"].tolist() == [1, 2, 3, 4]
    assert sample["labels"].tolist() == [2, -100, 4, 5]  # the shared last token is the last label
    assert sample["position_ids"].tolist() == [0, 1, 0, 1]
    assert sample["cu_seqlens"].tolist() == [0, 2, 4]
    ends_at_inputs = training_sample(np.array([1, 2, 3, 4, 5]), np.array([0, 4, 5]), extra_token=True)
    assert ends_at_inputs["labels"].tolist() == [2, 3, 4, -100]
    assert ends_at_inputs["cu_seqlens"].tolist() == [0, 4]


def reference_sample(row: np.ndarray, real: int, seq_len: int, document_of) -> dict[str, list[int]]:
    """Token by token, from what the tokens are (ids = stream positions): a new segment where the document
    changes or the padding begins; a label where the next token is real and of the same document."""
    is_real = [t < real for t in range(len(row))]
    same = [t > 0 and is_real[t] and is_real[t - 1] and document_of(row[t]) == document_of(row[t - 1])
            for t in range(len(row))]  # fmt: skip
    padding_starts = [t > 0 and not is_real[t] and is_real[t - 1] for t in range(len(row))]
    positions, labels, starts = [], [], []
    for t in range(seq_len):
        if t == 0 or padding_starts[t] or (is_real[t] and not same[t]):
            starts.append(t)
        positions.append(t - starts[-1])
        labels.append(int(row[t + 1]) if t + 1 < len(row) and same[t + 1] else IGNORE_INDEX)
    return {"labels": labels, "position_ids": positions, "cu_seqlens": [*starts, seq_len]}


@given(st.lists(st.integers(1, 50), min_size=1, max_size=30), st.integers(2, 48), st.sampled_from(["c", "c+1", "bfd"]))
def test_samples_match_the_token_by_token_reference(lengths, seq_len, mode):
    lengths = np.array(lengths)
    tokens = np.arange(lengths.sum())
    extra_token = mode == "c+1"
    if mode == "bfd":
        packed = pack_bfd(tokens, lengths, seq_len, pad_id=-1)
    else:
        packed = pack_concat(tokens, lengths, seq_len, pad_id=-1, extra_token=extra_token)
    ends = np.cumsum(lengths)

    def document_of(token: int) -> int:
        return int(np.searchsorted(ends, token, side="right"))

    for i, row in enumerate(np.asarray(packed.rows)):
        cu = packed.cu_seqlens[packed.row_offsets[i] : packed.row_offsets[i + 1]]
        sample = training_sample(row, cu, extra_token=extra_token)
        expected = reference_sample(row, int(cu[-1]), seq_len, document_of)
        assert sample["input_ids"].tolist() == row[:seq_len].tolist()
        assert {k: sample[k].tolist() for k in expected} == expected


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("loader") / "bfd"
    build_dataset(dataset_config(out, MODES["bfd"]))
    return out


def test_split_follows_the_shuffle_index(dataset):
    split = PackedSplit(dataset, "train")
    index = np.load(dataset / "packed/train/shuffle.npy")
    assert len(split) == len(index) > 100
    for i in (0, 1, len(split) // 2, len(split) - 1):
        shard, row = index[i]
        tokens, cu = PackedReader(dataset / f"packed/train/shard-{shard:05d}")[row]
        assert split[i]["input_ids"].tolist() == tokens.tolist()
        assert split[i]["cu_seqlens"].tolist() == sorted({*cu.tolist(), 1024})  # the padding closes the row
    in_order = PackedSplit(dataset, "train", shuffle=False)
    first, _ = PackedReader(dataset / "packed/train/shard-00001")[0]
    assert in_order[len(PackedReader(dataset / "packed/train/shard-00000"))]["input_ids"].tolist() == first.tolist()


def test_torch_dataset_gives_each_rank_and_worker_its_own_samples(dataset):
    torch = pytest.importorskip("torch")
    from tokenmill.loader_torch import PackedTorchDataset, collate_thd

    split = PackedSplit(dataset, "train")
    seen = []
    for rank in (0, 1):
        ranked = PackedTorchDataset(dataset, "train", rank=rank, world_size=2)
        assert len(ranked) == len(split) // 2
        # Workers forked from a forkserver, not from this process: forked from a pytest-xdist worker (its threads,
        # the signal handlers a flow run left), one exited with code 1 as its loader shut down, once in a suite.
        loader = torch.utils.data.DataLoader(
            ranked, batch_size=None, num_workers=2, multiprocessing_context="forkserver"
        )
        seen += [sample["input_ids"].numpy().tobytes() for sample in loader]
    expected = [split[p]["input_ids"].tobytes() for p in range(len(split) // 2 * 2)]
    assert sorted(seen) == sorted(expected)  # every position once, none twice, the odd one out left out

    samples = [next(iter(PackedTorchDataset(dataset, "train", rank=r, world_size=4))) for r in range(2)]
    batch = collate_thd(samples)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (2, 1024)
    expected_cu = [*samples[0]["cu_seqlens"][:-1].tolist(), *(samples[1]["cu_seqlens"] + 1024).tolist()]
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["cu_seqlens"].tolist() == expected_cu
    assert batch["max_seqlen"] == int(np.diff(expected_cu).max())


def test_loader_imports_without_torch():
    code = "import sys, tokenmill.loader; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
