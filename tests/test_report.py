"""The dataset report's plots stay small whatever the number of shards."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokenmill.formats.megatron import write_index
from tokenmill.io.storage import Store
from tokenmill.stages import report


def test_tokens_per_shard_bars_are_bounded_and_keep_the_totals():
    per_shard = pd.DataFrame({"train": np.arange(1, 451), "val": np.ones(450, int)}, index=pd.RangeIndex(450))
    bars, width = report.shard_bins(per_shard)
    assert width == 3 and len(bars) == 150 <= report.MAX_BARS
    assert list(bars.index[:3]) == [0, 3, 6]  # each bar starts at its first shard
    assert bars.loc[3, "train"] == (4 + 5 + 6) / 3
    assert (bars.sum() * width).tolist() == per_shard.sum().tolist()

    few = per_shard.iloc[:7]
    bars, width = report.shard_bins(few)
    assert width == 1 and bars.equals(few.astype(float))


def test_document_lengths_read_a_bounded_sample_of_indexes(tmp_path, monkeypatch):
    """The indexes the stats name (a split's shards with documents), at most MAX_INDEXES evenly spaced."""
    monkeypatch.setattr(report, "MAX_INDEXES", 4)
    for shard in range(10):
        rel = f"megatron/train/shard-{shard:05d}.idx"
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        write_index(tmp_path / rel, np.array([shard + 1, 100 + shard]), np.dtype(np.uint16))
    table = pd.DataFrame({"shard_id": [*range(10), 3], "split": ["train"] * 10 + ["val"], "documents": [2] * 10 + [0]})
    lengths, read, indexes = report.document_lengths(Store(tmp_path), table)
    assert (read, indexes) == (4, 10)
    assert sorted(lengths.tolist()) == sorted([s + 1 for s in (0, 3, 6, 9)] + [100 + s for s in (0, 3, 6, 9)])

    monkeypatch.setattr(report, "MAX_INDEXES", 256)
    lengths, read, indexes = report.document_lengths(Store(tmp_path), table)
    assert (read, indexes, len(lengths)) == (10, 10, 20)
