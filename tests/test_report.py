"""The dataset report's plots stay small whatever the number of shards."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokenmill.core.stats import split_summary
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


def _overlapping(artists, renderer) -> list[tuple[str, str]]:
    """The pairs of `artists` (texts, legends) whose drawn boxes overlap."""
    boxes = [(getattr(a, "get_text", lambda: "legend")(), a.get_window_extent(renderer)) for a in artists]
    return [(m, n) for k, (m, a) in enumerate(boxes) for n, b in boxes[k + 1 :] if a.overlaps(b)]


def test_a_mixtures_plots_keep_their_labels_apart_and_their_legends_off_the_bars():
    """Four sources' train and val splits over 60 shards of up to 250M tokens, documents of 1 to 20M tokens: in
    each plot no two tick labels of an axis overlap, nor a legend the axes. The split names side by side, the
    lengths' 1,000,000 and 10,000,000, and the legends over the bars all overlapped before."""
    report.load_matplotlib()
    sources = ["chat", "code", "crawl", "prose"]
    rows = []
    for shard in range(60):
        source, tokens = sources[shard % 4], 250_000_000 // (1 + shard % 7)
        for split, share in ((f"{source}/train", 0.99), (f"{source}/val", 0.01)):
            n = int(tokens * share)
            rows.append({"shard_id": shard, "split": split, "documents": n // 900, "tokens": n,
                         "packed_real_tokens": n, "packed_pad_tokens": n // 500, "packed_rows": n // 4096,
                         "padded_layout_rows": n // 900, "supervised_tokens": -1})  # fmt: skip
    table = pd.DataFrame(rows)
    lengths = np.geomspace(1, 20_000_000, 5_000).astype(np.int64)
    figures = {
        "lengths": report.lengths_figure(lengths, 8, 8),
        "shards": report.shards_figure(table),
        "utilization": report.utilization_figure(split_summary(table, 4096)),
    }
    for name, figure in figures.items():
        figure.canvas.draw()
        renderer, (ax,) = figure.canvas.get_renderer(), figure.axes
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            assert len(labels) >= 2 and not _overlapping(labels, renderer), (name, _overlapping(labels, renderer))
        for legend in [legend for legend in (ax.get_legend(), *figure.legends) if legend is not None]:
            assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer)), name
    assert [t.get_text() for t in figures["utilization"].axes[0].get_yticklabels()] == sorted(
        f"{s}/{split}" for s in sources for split in ("train", "val")
    )
    assert {t.get_text() for t in figures["lengths"].axes[0].get_xticklabels()} >= {"1k", "1M", "10M"}


def test_the_tokenize_stages_rate_is_of_the_shards_the_run_made():
    """A rerun's rate is of what it tokenized, and says how many of the shards that was; nothing made says so."""
    rate = report.tokenize_rate
    assert rate({"shards_made": 4, "tokenize_mb_per_s": 81.5}, 4) == "tokenize stage 81.5 MB/s of input"
    assert rate({"shards_made": 2, "tokenize_mb_per_s": 3.2}, 63) == (
        "tokenize stage 3.2 MB/s of input (the 2 of 63 shards it made)"
    )
    assert rate({"shards_made": 0, "tokenize_mb_per_s": None}, 63) == "tokenize stage: every shard reused"
    assert rate({"shards_made": 1, "tokenize_mb_per_s": None}, 63).startswith("tokenize stage: no input")
