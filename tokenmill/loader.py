"""Packed output as training samples: what a training loop reads (a local copy of a published dataset).

- `training_sample`: one packed row as `input_ids`, `labels`, `position_ids` and `cu_seqlens`.
- `PackedSplit` (numpy only): every packed row of one split across its shards, memory-mapped, in the
  order of the split's global shuffle index (or in shard order); of a mixture, the mix (every source's rows
  as often as the mix draws them, shuffled), or one source's split (`<source>/<split>`); with `with_origin`, each
  sample with the origin of every document in it (its row of the documents table, `formats.provenance`).
- `PackedTorchDataset` and `collate_thd`, in `tokenmill.loader_torch` (it needs torch, this module does not): a
  `torch.utils.data.IterableDataset` giving each rank, and each DataLoader worker within a rank, its
  own samples; and a collate function that flattens a batch for varlen (THD) attention.

Every sample covers exactly `seq_len` input positions. Its `cu_seqlens` runs from 0 to `seq_len`: the
pieces of documents in the row, then the padding as one last segment when the row is padded.
`position_ids` restart at 0 at each segment. Label t is token t + 1 of the row, or -100 where that
token is padding, beyond the row, or (with `mask_cross_document_labels`) the start of another piece, or, in
a split of conversations, a token that carries no loss (its packed loss mask, docs/chat.md).

A split of preference pairs (`input.preference`) holds whole pairs in each row: its segments come two by two, a pair's
chosen sequence (the prompt, then the chosen completion) and then its rejected one (the prompt again, then the
rejected completion), each a segment of its own (positions restarting, no label across it), the labels only on the
completions' tokens. Its samples also have `pairs`: int32 `[n_pairs, 2, 2]`, each pair's chosen `(start, end)` and
rejected `(start, end)` in the row, from which a DPO step sums each side's log-probabilities (`pair_spans`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from tokenmill.core import layout
from tokenmill.formats.packed import PackedReader, read_shuffle_index
from tokenmill.formats.provenance import read_documents_table

IGNORE_INDEX = -100  # the label PyTorch's cross-entropy skips


def training_sample(
    row: np.ndarray,
    cu_seqlens: np.ndarray,
    *,
    extra_token: bool = False,
    mask_cross_document_labels: bool = True,
    loss: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """One packed row (its tokens and stored boundaries) as a training sample.

    Args:
        row: the row's tokens, as `PackedSplit.row` gives them.
        cu_seqlens: the row's stored boundaries: 0, the end of each piece of a document, the real length.
        extra_token: the dataset was packed with `pack.extra_token` (rows `seq_len + 1` wide, their last token
            only a label).
        mask_cross_document_labels: label -100 where the next token starts another piece, so that no position
            learns to predict across a document boundary.
        loss: a row of conversations' loss mask (`packed/<split>/shard-NNNNN.loss.npy`, see docs/chat.md): label
            -100 also where the next token carries no loss (a prompt's, a conversation's first).

    Returns:
        `input_ids`, `labels` (-100 where masked), `position_ids` (restarting at 0 at each segment) and
        `cu_seqlens` (int32, from 0 to `seq_len`, the padding as one last segment), as numpy arrays.
    """
    row, cu = np.asarray(row), np.asarray(cu_seqlens, dtype=np.int64)
    seq_len = len(row) - extra_token
    real = int(cu[-1])
    # Segments of the inputs: the pieces (one running past the inputs ends with them), then the padding.
    bounds = np.unique(np.append(np.minimum(cu, seq_len), seq_len))
    position_ids = np.arange(seq_len, dtype=np.int64) - np.repeat(bounds[:-1], np.diff(bounds))
    targets = np.arange(1, seq_len + 1)
    valid = targets < real
    if mask_cross_document_labels:
        valid &= ~np.isin(targets, cu[1:-1])
    if loss is not None:
        valid[valid] = np.asarray(loss)[targets[valid]] == 1
    labels = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    labels[valid] = row[targets[valid]]
    return {
        "input_ids": row[:seq_len].astype(np.int64),
        "labels": labels,
        "position_ids": position_ids,
        "cu_seqlens": bounds.astype(np.int32),
    }


def pair_spans(cu_seqlens: np.ndarray) -> np.ndarray:
    """A row of preference pairs' stored boundaries (`PackedSplit.row(i)[1]`: 0, each sequence's end) as int32
    `[n_pairs, 2, 2]`: each pair's chosen `(start, end)`, then its rejected `(start, end)`."""
    cu = np.asarray(cu_seqlens, dtype=np.int32)
    if (len(cu) - 1) % 2:
        raise ValueError(f"{len(cu) - 1} sequences in a row of pairs: not two per pair")
    return np.stack([cu[:-1], cu[1:]], axis=1).reshape(-1, 2, 2)


class PackedSplit:
    """The packed rows of one split of a dataset directory, as training samples (`split[i]`).

    With `shuffle` sample i is the row at entry i of `packed/<split>/shuffle.npy`; without, rows come in
    shard order. A mixture's training split is its mix: sample i is entry i of `mix/packed/<split>.npy`, every
    source's rows drawn as often as the mix says, shuffled (`shuffle` does not apply); its other splits, and
    each source's, are `<source>/<split>`. Files are memory-mapped on first access in each process (so the
    object pickles small, as DataLoader workers need).
    """

    def __init__(
        self,
        root: str | Path,
        split: str,
        *,
        shuffle: bool = True,
        mask_cross_document_labels: bool = True,
        with_origin: bool = False,
    ):
        """
        Args:
            root: a dataset directory: a published version, or a build (`output.path`), local.
            split: a split's name (`train`, `val`, ...), or in a mixture one source's, `<source>/<split>`.
            shuffle: read the rows in the order of the split's global shuffle index (`pack.shuffle_seed`); off,
                in shard order. A mixture's training split is always read in its mix's order.
            mask_cross_document_labels: as in `training_sample`.
            with_origin: each sample also has `origin`: a dict per document the row holds a piece of, in row
                order: its row of the documents table (id, source, file, line, split, token_offset, token_length,
                the metadata fields), its `shard`, where the piece starts in the row (`row_start`) and in the
                document (`document_start`). Rows packed by `concat` only: a row of them is a window of the
                shard's `.bin`.
        """
        self.root, self.split, self.shuffle = Path(root), split, shuffle
        self.mask_cross_document_labels = mask_cross_document_labels
        manifest = json.loads((self.root / layout.MANIFEST).read_text())
        self.extra_token = bool(manifest["config"]["pack"].get("extra_token", False))
        self.seq_len, self.with_origin = int(manifest["config"]["pack"]["seq_len"]), with_origin
        if with_origin and (mode := manifest["config"]["pack"]["mode"]) != "concat":
            raise ValueError(f"{self.root}: with_origin needs rows packed by concat, these are by {mode}")
        self.mixed = manifest.get("mix", {}).get("split") == split
        in_split = (lambda s: s.endswith(f"/{split}")) if self.mixed else (lambda s: s == split)
        streams = {
            f["shard"]: f["split"] for f in manifest["files"] if f["kind"] == "packed-tokens" and in_split(f["split"])
        }
        self.shard_ids = sorted(streams)
        self.streams = [streams[shard] for shard in self.shard_ids]  # each shard's `<source>/<split>` in a mixture
        if not self.shard_ids:
            raise ValueError(f"{self.root}: split {split!r} has no packed rows")
        self.order_file = layout.mix_packed_file(split) if self.mixed else layout.shuffle_file(split)
        self.shuffle = shuffle or self.mixed
        self._shard_position = {shard: i for i, shard in enumerate(self.shard_ids)}
        config = manifest["config"]
        if config.get("sources"):  # a mixture's streams are `<source>/<split>`
            pairs = {s["name"] for s in config["sources"] if s["input"].get("preference")}
            self.pair_streams = {stream for stream in self.streams if stream.split("/")[0] in pairs}
        else:
            self.pair_streams = set(self.streams) if config["input"].get("preference") else set()
        counts = [self._readers_or_open()[i].rows.shape[0] for i in range(len(self.shard_ids))]
        self._first_row = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def __len__(self) -> int:
        return len(self._order_or_open()) if self.mixed else int(self._first_row[-1])

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        reader, row = self._place(i)
        sample = training_sample(
            *reader[row],
            extra_token=self.extra_token,
            mask_cross_document_labels=self.mask_cross_document_labels,
            loss=None if reader.loss is None else reader.loss[row],
        )
        if self.with_origin:
            sample["origin"] = self.origin(i)
        if self.pair_streams and self.streams[self._position(i)[0]] in self.pair_streams:
            sample["pairs"] = pair_spans(reader[row][1])
        return sample

    def origin(self, i: int) -> list[dict]:
        """Where sample i's tokens came from: a dict per document it holds a piece of (see `with_origin`)."""
        position, row = self._position(i)
        reader = self._readers_or_open()[position]
        table = self._table(position)
        offsets, lengths = (table.column(c).to_numpy() for c in ("token_offset", "token_length"))
        first = row * self.seq_len  # a concat row is a window of the shard's `.bin`
        last = first + int(reader[row][1][-1])  # its real tokens end here
        begin = int(np.searchsorted(offsets + lengths, first, side="right"))
        end = int(np.searchsorted(offsets, last, side="left"))
        return [
            {
                **document,
                "shard": self.shard_ids[position],
                "row_start": max(document["token_offset"] - first, 0),
                "document_start": max(first - document["token_offset"], 0),
            }
            for document in table.slice(begin, end - begin).to_pylist()
        ]

    def _table(self, position: int):
        """The documents table of the shard at `position`, read once per process."""
        if getattr(self, "_tables", None) is None:
            self._tables = {}
        if position not in self._tables:
            rel = layout.documents_table(self.streams[position], self.shard_ids[position])
            self._tables[position] = read_documents_table(self.root / rel)
        return self._tables[position]

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample i's stored row and boundaries."""
        reader, row = self._place(i)
        return reader[row]

    def _place(self, i: int) -> tuple[PackedReader, int]:
        """Sample i's shard (its reader) and row there."""
        position, row = self._position(i)
        return self._readers_or_open()[position], row

    def _position(self, i: int) -> tuple[int, int]:
        """Sample i's shard (its position in `shard_ids`) and row there."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} of a split of {len(self)}")
        if self.shuffle:
            shard, row = (int(v) for v in self._order_or_open()[i])
            position = self._shard_position[shard]
        else:
            position = int(np.searchsorted(self._first_row, i, side="right")) - 1
            row = i - int(self._first_row[position])
        return position, row

    def _readers_or_open(self) -> list[PackedReader]:
        if getattr(self, "_readers", None) is None:
            self._readers = [
                PackedReader(self.root / layout.packed_prefix(stream, shard))
                for stream, shard in zip(self.streams, self.shard_ids, strict=True)
            ]
        return self._readers

    def _order_or_open(self) -> np.ndarray:
        if getattr(self, "_order", None) is None:
            self._order = read_shuffle_index(self.root / self.order_file)
        return self._order

    def __getstate__(self) -> dict:
        # Memory maps pickle as full copies: leave them out, each process maps the files itself.
        return {k: v for k, v in self.__dict__.items() if k not in ("_readers", "_order", "_tables")}


def __getattr__(name: str):
    # The torch parts were here once: say where they are now, not only that they are missing.
    if name in ("PackedTorchDataset", "collate_thd"):
        raise AttributeError(
            f"{name} is in tokenmill.loader_torch (it needs torch): from tokenmill.loader_torch import {name}"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def distributed_rank() -> tuple[int, int]:
    """(rank, world size): torch.distributed's when initialized, else $RANK/$WORLD_SIZE, else (0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
